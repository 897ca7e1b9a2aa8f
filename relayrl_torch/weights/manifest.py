"""Manifests of immutable weight versions, and the byte-level checks every shard passes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import xxhash

from relayrl.contracts.proto.v1 import relay_pb2


class WeightError(ValueError):
    """A version or shard that must not reach an engine (unknown, corrupt, mismatched)."""


def checksum(data: bytes | bytearray | memoryview) -> str:
    # xxh3-128 catches corruption and truncation at ~10 GB/s; the data is not adversarial
    # (the channel carries the token), so a cryptographic hash would only cost time
    return xxhash.xxh3_128_hexdigest(data)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    flat = t.detach().contiguous().view(-1).view(torch.uint8)
    return memoryview(flat.numpy()).cast("B")


@dataclass(frozen=True)
class ShardInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    checksum: str


@dataclass(frozen=True)
class Manifest:
    version: int
    step: int
    shards: tuple[ShardInfo, ...]
    created_unix: float = field(default_factory=time.time)
    signature: bytes = b""  # the trainer's, over relayrl_torch.weights.signing's bytes

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.shards)

    def shard(self, name: str) -> ShardInfo:
        for s in self.shards:
            if s.name == name:
                return s
        raise WeightError(f"version {self.version} has no shard {name!r}")

    def to_proto(self) -> relay_pb2.Manifest:
        return relay_pb2.Manifest(
            version=self.version, step=self.step, total_bytes=self.total_bytes,
            created_unix=self.created_unix, signature=self.signature,
            shards=[relay_pb2.ShardInfo(name=s.name, dtype=s.dtype, shape=list(s.shape),
                                        nbytes=s.nbytes, checksum=s.checksum)
                    for s in self.shards],
        )

    @classmethod
    def from_proto(cls, m: relay_pb2.Manifest) -> Manifest:
        if m.version < 1:
            raise WeightError(f"manifest.version must be >= 1, got {m.version}")
        if not m.shards:
            raise WeightError("manifest.shards: a version must carry at least one shard")
        shards = []
        for s in m.shards:
            if not s.name or s.nbytes < 0 or not s.checksum:
                raise WeightError(f"manifest.shards[{s.name!r}]: name, nbytes and checksum needed")
            dtype = torch_dtype(s.dtype)
            if any(d < 0 for d in s.shape):
                raise WeightError(f"manifest.shards[{s.name!r}].shape has a negative size")
            numel = 1
            for d in s.shape:
                numel *= d
            if numel * dtype.itemsize != s.nbytes:
                raise WeightError(f"manifest.shards[{s.name!r}].nbytes does not match shape/dtype")
            shards.append(ShardInfo(s.name, s.dtype, tuple(s.shape), s.nbytes, s.checksum))
        if len({s.name for s in shards}) != len(shards):
            raise WeightError("manifest.shards: duplicate shard names")
        return cls(m.version, m.step, tuple(shards), m.created_unix, m.signature)


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise WeightError(f"shard dtype {name!r} is not a torch dtype")
    return dtype


def build_manifest(version: int, step: int, tensors: dict[str, torch.Tensor]) -> Manifest:
    shards = tuple(
        ShardInfo(
            name=name, dtype=str(t.dtype).removeprefix("torch."), shape=tuple(t.shape),
            nbytes=t.numel() * t.element_size(), checksum=checksum(tensor_bytes(t)),
        )
        for name, t in tensors.items()
    )
    return Manifest(version=version, step=step, shards=shards)


def verify_shard(info: ShardInfo, data: bytes | bytearray | memoryview) -> torch.Tensor:
    """Bytes -> tensor, only if length and checksum match the manifest. The tensor views
    `data` when it is writable, and a copy otherwise."""
    view = memoryview(data).cast("B")
    if len(view) != info.nbytes:
        raise WeightError(
            f"shard {info.name!r}: got {len(view)} bytes, manifest says {info.nbytes}")
    if checksum(view) != info.checksum:
        raise WeightError(f"shard {info.name!r}: checksum mismatch")
    if not info.nbytes:
        return torch.empty(info.shape, dtype=torch_dtype(info.dtype))
    if view.readonly:
        view = memoryview(bytearray(view))
    return torch.frombuffer(view, dtype=torch_dtype(info.dtype)).view(info.shape)
