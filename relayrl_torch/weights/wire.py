"""The BytesChunk message, and DeltaChunk's data, encoded and decoded by hand. Building a
protobuf message around a megabyte of bytes costs ~50x a single copy, so the hot path writes
the wire format itself: one length-delimited field. Any protobuf client still reads it as
the message it is."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from relayrl.contracts.proto.v1 import relay_pb2
from relayrl_torch.weights.manifest import WeightError

_TAG = b"\x0a"  # field number 1, wire type 2
_DELTA_DATA_TAG = b"\x12"  # DeltaChunk.data: field number 2, wire type 2


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
    if not raw:
        return memoryview(raw)
    if raw[:1] != _TAG:
        raise WeightError("BytesChunk: unexpected field on the wire")
    return _length_delimited(raw, "BytesChunk")


def encode_delta_chunk(chunk: relay_pb2.DeltaChunk | memoryview | bytes) -> bytes:
    """A DeltaChunk: the header as protobuf writes it, data written by hand."""
    if isinstance(chunk, relay_pb2.DeltaChunk):
        return chunk.SerializeToString()
    return b"".join((_DELTA_DATA_TAG, _varint(len(chunk)), chunk))


def decode_delta_chunk(raw: bytes) -> relay_pb2.DeltaHeader | memoryview:
    """A DeltaChunk's header, or a view of its data."""
    if raw[:1] == _DELTA_DATA_TAG:
        return _length_delimited(raw, "DeltaChunk.data")
    try:
        chunk = relay_pb2.DeltaChunk.FromString(raw)
    except DecodeError as err:
        raise WeightError(f"DeltaChunk: {err}") from None
    if chunk.WhichOneof("payload") != "header":
        raise WeightError("DeltaChunk: neither a header nor data")
    return chunk.header


def _length_delimited(raw: bytes, what: str) -> memoryview:
    """The bytes of a message that is one length-delimited field, its tag first."""
    view = memoryview(raw)
    n, shift, pos = 0, 0, 1
    while True:
        if pos >= len(raw) or shift > 63:
            raise WeightError(f"{what}: truncated length")
        byte = raw[pos]
        n |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            break
        shift += 7
    if pos + n != len(raw):
        raise WeightError(f"{what}: length says {n} bytes, message holds {len(raw) - pos}")
    return view[pos:]


def with_fast_pull_bytes(add_generated: Any, servicer: Any, server: grpc.Server) -> None:
    """Register the generated handlers of a servicer, but with PullBytes and PullDelta
    answered through encode_bytes_chunk and encode_delta_chunk instead of the generated
    protobuf serializers."""

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
    generated = cap.handlers["PullDelta"]
    cap.handlers["PullDelta"] = grpc.unary_stream_rpc_method_handler(
        servicer.PullDelta, request_deserializer=generated.request_deserializer,
        response_serializer=encode_delta_chunk)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(cap.service, cap.handlers),))
    server.add_registered_method_handlers(cap.service, cap.handlers)
