"""The flat layout of a version: every shard packed in manifest order into one buffer, each
starting on a 64-byte boundary. Every data plane moves this one buffer, so a transfer is a
single contiguous copy and both ends derive the offsets from the manifest alone."""

from __future__ import annotations

import torch

from relayrl.weights.manifest import Manifest, WeightError, verify_shard

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def shard_offsets(manifest: Manifest) -> dict[str, int]:
    offsets, pos = {}, 0
    for s in manifest.shards:
        offsets[s.name] = pos
        pos = _align(pos + s.nbytes)
    return offsets


def flat_size(manifest: Manifest) -> int:
    if not manifest.shards:
        return 0
    last = manifest.shards[-1]
    return shard_offsets(manifest)[last.name] + last.nbytes


def pack(manifest: Manifest, tensors: dict[str, torch.Tensor], out: torch.Tensor) -> None:
    """Copy `tensors` into the uint8 buffer `out` at their layout offsets."""
    assert out.dtype == torch.uint8 and out.numel() >= flat_size(manifest)
    for s, off in zip(manifest.shards, shard_offsets(manifest).values(), strict=True):
        t = tensors[s.name].detach().contiguous().view(-1).view(torch.uint8)
        out[off:off + s.nbytes].copy_(t)


def unpack(manifest: Manifest, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Verified tensors viewing `flat` (no copy): every shard's length and checksum must
    match the manifest, or WeightError names the shard."""
    if flat.numel() < flat_size(manifest):
        raise WeightError(f"version {manifest.version}: got {flat.numel()} bytes, "
                          f"its layout needs {flat_size(manifest)}")
    arr = flat.numpy()
    out = {}
    for s, off in zip(manifest.shards, shard_offsets(manifest).values(), strict=True):
        out[s.name] = verify_shard(s, memoryview(arr[off:off + s.nbytes]))
    return out
