"""The BytesChunk message encoded and decoded by hand. Building a protobuf message around a
megabyte of bytes costs ~50x a single copy, so the hot path writes the wire format itself:
field 1, length-delimited. Any protobuf client still reads it as a BytesChunk."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc

from relayrl_torch.weights.manifest import WeightError

_TAG = b"\x0a"  # field number 1, wire type 2


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def iter_chunks(data: memoryview, chunk_bytes: int) -> Iterator[tuple[int, memoryview]]:
    """(offset, slice) pieces of `data`; an empty buffer still yields one empty piece."""
    view = memoryview(data).cast("B")
    for off in range(0, max(len(view), 1), chunk_bytes):
        yield off, view[off:off + chunk_bytes]


def encode_publish_chunk(shard: str, offset: int, data: memoryview | bytes) -> bytes:
    """A PublishMessage{chunk: ShardChunk{shard, offset, data}} on the wire."""
    name = shard.encode()
    head = b"".join((b"\x0a", _varint(len(name)), name, b"\x10", _varint(offset),
                     b"\x1a", _varint(len(data))))
    return b"".join((b"\x12", _varint(len(head) + len(data)), head, data))


def encode_bytes_chunk(data: memoryview | bytes) -> bytes:
    if not len(data):
        return b""
    return b"".join((_TAG, _varint(len(data)), data))


def decode_bytes_chunk(raw: bytes) -> memoryview:
    view = memoryview(raw)
    if not raw:
        return view
    if raw[:1] != _TAG:
        raise WeightError("BytesChunk: unexpected field on the wire")
    n, shift, pos = 0, 0, 1
    while True:
        if pos >= len(raw) or shift > 63:
            raise WeightError("BytesChunk: truncated length")
        byte = raw[pos]
        n |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            break
        shift += 7
    if pos + n != len(raw):
        raise WeightError(f"BytesChunk: length says {n} bytes, message holds {len(raw) - pos}")
    return view[pos:]


def with_fast_pull_bytes(add_generated: Any, servicer: Any, server: grpc.Server) -> None:
    """Register the generated handlers of a servicer, but with PullBytes answered through
    encode_bytes_chunk instead of the generated protobuf serializer."""

    class _Capture:
        handlers: dict[str, grpc.RpcMethodHandler] = {}

        def add_generic_rpc_handlers(self, _):
            pass

        def add_registered_method_handlers(self, service, handlers):
            self.service, self.handlers = service, dict(handlers)

    cap = _Capture()
    add_generated(servicer, cap)
    generated = cap.handlers["PullBytes"]
    cap.handlers["PullBytes"] = grpc.unary_stream_rpc_method_handler(
        servicer.PullBytes, request_deserializer=generated.request_deserializer,
        response_serializer=encode_bytes_chunk)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(cap.service, cap.handlers),))
    server.add_registered_method_handlers(cap.service, cap.handlers)
