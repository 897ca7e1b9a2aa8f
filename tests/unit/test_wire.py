"""The hand-written wire encodings agree with the protobuf library, both ways."""

import pytest

from relayrl.contracts.proto.v1 import relay_pb2
from relayrl_torch.weights import WeightError
from relayrl_torch.weights.wire import decode_bytes_chunk, encode_bytes_chunk, encode_publish_chunk


@pytest.mark.parametrize("n", [0, 1, 127, 128, 16_383, 16_384, 1 << 20])
def test_bytes_chunk_matches_protobuf(n):
    data = bytes(range(256)) * (n // 256) + bytes(n % 256)
    ours = encode_bytes_chunk(memoryview(data))
    assert relay_pb2.BytesChunk.FromString(ours).data == data
    theirs = relay_pb2.BytesChunk(data=data).SerializeToString()
    assert bytes(decode_bytes_chunk(theirs)) == data


@pytest.mark.parametrize("offset", [0, 1, 300, 1 << 40])
def test_publish_chunk_matches_protobuf(offset):
    msg = relay_pb2.PublishMessage.FromString(encode_publish_chunk("layer.0/wé", offset, b"xyz"))
    assert msg.WhichOneof("payload") == "chunk"
    assert (msg.chunk.shard, msg.chunk.offset, msg.chunk.data) == ("layer.0/wé", offset, b"xyz")


@pytest.mark.parametrize("raw,why", [
    (b"\x12\x01a", "unexpected field"),
    (b"\x0a\x85", "truncated"),
    (b"\x0a\x05abc", "length says 5"),
])
def test_malformed_chunks_are_refused_by_name(raw, why):
    with pytest.raises(WeightError, match=why):
        decode_bytes_chunk(raw)
