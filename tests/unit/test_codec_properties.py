"""Property tests over the wire codecs: every array round-trips, and any payload either
decodes or is refused with a CodecError that names the field, never another exception."""

import msgpack
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from relayrl.contracts.codec import CodecError, decode, decode_array, encode, encode_array
from relayrl.contracts.messages import Batch, Group, Sample, decode_batch, decode_group
from relayrl.contracts.partial import PartialGroup
from relayrl_torch.sampling.kv_state import SequenceKV

DTYPES = ["int32", "int64", "float16", "float32", "float64", "uint8", "bool"]
FAST = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])

wire_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=8) | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


def decoders():
    return [lambda p: decode(p, Sample), decode_group, decode_batch, SequenceKV.decode,
            lambda p: PartialGroup.decode(p, 0, 2)]


def refused_cleanly(payload: bytes) -> None:
    for decode_one in decoders():
        try:
            decode_one(payload)
        except CodecError as err:
            assert str(err), "a refusal must say what was wrong"


@FAST
@given(st.sampled_from(DTYPES).flatmap(
    lambda d: hnp.arrays(d, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))))
def test_every_array_round_trips(arr):
    back = decode_array(encode_array(arr), "x")
    assert back.dtype == arr.dtype and back.shape == arr.shape
    assert np.array_equal(back, arr, equal_nan=arr.dtype.kind == "f")


@FAST
@given(st.binary(max_size=256))
def test_arbitrary_bytes_are_refused_with_a_codec_error(payload):
    refused_cleanly(payload)


@FAST
@given(wire_values)
def test_arbitrary_msgpack_documents_are_refused_with_a_codec_error(doc):
    refused_cleanly(msgpack.packb(doc, use_bin_type=True))


def valid_sample() -> Sample:
    return Sample(prompt_id=3, lease_id="L1", worker_id="w", prompt_tokens=[1, 2],
                  response_tokens=[4, 5, 6], logprobs=[-0.1, -0.2, -0.3], versions=[1, 1, 2],
                  reward=1.0, loss_mask=[1, 0, 1])


@FAST
@given(st.data())
def test_a_sample_with_one_field_replaced_decodes_or_names_a_field(data):
    wire = msgpack.unpackb(encode(valid_sample()))
    key = data.draw(st.sampled_from(sorted(wire) + ["extra_field"]))
    wire[key] = data.draw(wire_values | st.builds(
        encode_array, st.sampled_from(DTYPES).flatmap(lambda d: hnp.arrays(d, st.integers(0, 4)))))
    try:
        decode(msgpack.packb(wire, use_bin_type=True), Sample)
    except CodecError as err:
        assert str(err).startswith(("sample", "payload")), err
    batch = {"kind": "batch", "batch_id": "b", "groups": [{"prompt_id": 3, "samples": [wire]}]}
    try:
        decode_batch(msgpack.packb(batch, use_bin_type=True))
    except CodecError as err:
        assert str(err).startswith("batch"), err


@FAST
@given(st.integers(0, 200), st.integers(0, 7))
def test_truncated_or_flipped_sample_payloads_are_refused_or_equal(cut, bit):
    payload = encode(valid_sample())
    for bad in (payload[:cut], payload[:cut] + bytes([payload[cut % len(payload)] ^ (1 << bit)])
                + payload[cut + 1:]):
        try:
            s = decode(bad, Sample)
        except CodecError:
            continue
        assert isinstance(s, Sample)


def test_a_valid_batch_round_trips():
    s = valid_sample()
    b = decode_batch(encode(Batch("b", [Group(3, [s])])))
    assert isinstance(b, Batch) and isinstance(b.groups[0], Group)
    assert b.groups[0].samples[0].response_tokens.tolist() == [4, 5, 6]
