"""The gRPC implementation of the weight plane: chunked streams to and from a relay."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import torch

from relayrl.grpc_util import channel
from relayrl.proto.v1 import relay_pb2, relay_pb2_grpc
from relayrl.weights.chunks import ShardAssembler, iter_chunks
from relayrl.weights.manifest import (
    Manifest,
    WeightError,
    build_manifest,
    tensor_bytes,
    verify_shard,
)
from relayrl.weights.plane import WeightPlane


class RelayClient(WeightPlane):
    def __init__(self, address: str, chunk_bytes: int = 1 << 20, timeout_s: float = 60.0):
        self.address = address
        self.chunk_bytes = chunk_bytes
        self.timeout_s = timeout_s
        self._channel = channel(address)
        self._stub = relay_pb2_grpc.RelayStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def _messages(self, manifest: Manifest, tensors: dict[str, torch.Tensor]
                  ) -> Iterator[relay_pb2.PublishMessage]:
        yield relay_pb2.PublishMessage(manifest=manifest.to_proto())
        for name, t in tensors.items():
            for chunk in iter_chunks(name, tensor_bytes(t), self.chunk_bytes):
                yield relay_pb2.PublishMessage(chunk=chunk)

    def publish(self, version: int, step: int, tensors: dict[str, torch.Tensor]) -> Manifest:
        manifest = build_manifest(version, step, tensors)
        try:
            self._stub.Publish(self._messages(manifest, tensors), timeout=self.timeout_s)
        except grpc.RpcError as err:
            raise WeightError(f"publish of version {version} to {self.address} failed: "
                              f"{err.details()}") from None
        return manifest

    def manifest(self, version: int = 0) -> Manifest | None:
        try:
            m = self._stub.GetManifest(relay_pb2.GetManifestRequest(version=version),
                                       timeout=self.timeout_s)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND and version == 0:
                return None
            raise WeightError(f"manifest of version {version} from {self.address}: "
                              f"{err.details()}") from None
        return Manifest.from_proto(m)

    def pull(self, version: int) -> dict[str, torch.Tensor]:
        manifest = self.manifest(version)
        if manifest is None:
            raise WeightError(f"relay {self.address} holds no version")
        assembler = ShardAssembler(manifest)
        try:
            for chunk in self._stub.Pull(relay_pb2.PullRequest(version=manifest.version),
                                         timeout=self.timeout_s):
                assembler.add(chunk)
        except grpc.RpcError as err:
            raise WeightError(f"pull of version {manifest.version} from {self.address}: "
                              f"{err.details()}") from None
        buffers = assembler.finish()
        return {s.name: verify_shard(s, buffers[s.name]) for s in manifest.shards}

    def versions(self) -> list[int]:
        resp = self._stub.ListVersions(relay_pb2.ListVersionsRequest(), timeout=self.timeout_s)
        return list(resp.versions)
