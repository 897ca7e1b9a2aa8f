"""Shard bytes <-> chunks, shared by every sender and receiver of weights over gRPC."""

from __future__ import annotations

from collections.abc import Iterator

from relayrl.proto.v1 import relay_pb2
from relayrl.weights.manifest import Manifest, WeightError


def iter_chunks(name: str, data: memoryview | bytes, chunk_bytes: int
                ) -> Iterator[relay_pb2.ShardChunk]:
    view = memoryview(data)
    for off in range(0, max(len(view), 1), chunk_bytes):  # an empty shard still sends one chunk
        yield relay_pb2.ShardChunk(shard=name, offset=off, data=bytes(view[off:off + chunk_bytes]))


class ShardAssembler:
    """Collects chunks into per-shard buffers sized by the manifest; refuses any chunk that
    does not fit, and any shard left incomplete."""

    def __init__(self, manifest: Manifest):
        self.manifest = manifest
        self.buffers = {s.name: bytearray(s.nbytes) for s in manifest.shards}
        self.filled = dict.fromkeys(self.buffers, 0)

    def add(self, chunk: relay_pb2.ShardChunk) -> None:
        buf = self.buffers.get(chunk.shard)
        end = chunk.offset + len(chunk.data)
        if buf is None or chunk.offset < 0 or end > len(buf):
            raise WeightError(f"chunk for shard {chunk.shard!r} at offset {chunk.offset} "
                              f"does not fit version {self.manifest.version}")
        buf[chunk.offset:end] = chunk.data
        self.filled[chunk.shard] += len(chunk.data)

    @property
    def received(self) -> int:
        return sum(self.filled.values())

    def finish(self) -> dict[str, bytearray]:
        for s in self.manifest.shards:
            if self.filled[s.name] != s.nbytes:
                raise WeightError(
                    f"shard {s.name!r}: received {self.filled[s.name]} of {s.nbytes} bytes")
        return self.buffers
