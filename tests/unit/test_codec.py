import msgpack
import numpy as np
import pytest

from relayrl.contracts.codec import CodecError, decode, decode_array, encode, encode_array
from relayrl.contracts.messages import (
    Batch,
    FinishReason,
    Group,
    Sample,
    decode_batch,
    decode_group,
    encode_batch,
    encode_group,
    validate_sample,
)


def decode_sample(payload: bytes) -> Sample:
    return decode(payload, Sample)


def wire_of(s: Sample) -> dict:
    """The sample's msgpack map, to spoil one field of."""
    return msgpack.unpackb(encode(s))


def packed(wire: dict) -> bytes:
    return msgpack.packb(wire, use_bin_type=True)


def make_sample(prompt_id=3, n=3, version=5):
    return Sample(prompt_id=prompt_id, lease_id="L1", worker_id="rollout-0",
                  prompt_tokens=[1, 4, 5], response_tokens=list(range(6, 6 + n)),
                  logprobs=[-0.5] * n, versions=[version] * n, reward=1.0)


def test_sample_round_trip():
    s = make_sample()
    back = decode_sample(encode(s))
    for name in ("prompt_tokens", "response_tokens", "logprobs", "versions"):
        np.testing.assert_array_equal(getattr(back, name), getattr(s, name))
    assert (back.prompt_id, back.lease_id, back.reward) == (3, "L1", 1.0)
    assert back.finish_reason is FinishReason.STOP


def test_group_round_trip_is_one_value():
    g = Group(3, [make_sample(), make_sample(version=2)])
    back = decode_group(encode_group(g))
    assert back.prompt_id == 3 and back.oldest_version == 2 and len(back.samples) == 2


def test_batch_round_trip():
    b = Batch("b1", [Group(3, [make_sample(), make_sample(version=2)]), Group(4, [make_sample(4)])])
    back = decode_batch(encode_batch(b))
    assert [g.prompt_id for g in back.groups] == [3, 4]
    assert back.groups[0].oldest_version == 2
    assert [len(g.samples) for g in back.groups] == [2, 1]


def test_array_round_trip_keeps_dtype_and_shape():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    back = decode_array(encode_array(a), "x")
    assert back.dtype == np.float32 and back.shape == (3, 4)
    np.testing.assert_array_equal(back, a)


@pytest.mark.parametrize("payload,field", [
    (b"\xc1\xff", "msgpack"),
    (msgpack.packb({"schema": 99, "kind": "sample"}), "sample.schema"),
    (msgpack.packb({"schema": 1, "kind": "batch"}), "sample.kind"),
    (msgpack.packb([1, 2]), "sample: expected `object`"),
])
def test_bad_envelopes_are_refused_with_the_field(payload, field):
    with pytest.raises(CodecError, match=field):
        decode_sample(payload)


def test_mismatched_lengths_name_the_field():
    s = make_sample()
    s.logprobs = np.zeros(2, dtype=np.float32)
    with pytest.raises(CodecError, match="sample.logprobs: 2 values for 3"):
        validate_sample(s)


def test_truncated_array_data_names_the_field():
    wire = wire_of(make_sample())
    wire["versions"]["data"] = wire["versions"]["data"][:-3]
    with pytest.raises(CodecError, match="sample.versions.data: 21 bytes"):
        decode_sample(packed(wire))


def test_float_token_ids_and_unknown_finish_reasons_are_refused():
    wire = wire_of(make_sample())
    wire["response_tokens"] = encode_array(np.array([6.0, 7.0, 8.0], dtype=np.float32))
    with pytest.raises(CodecError, match="sample.response_tokens: expected integers"):
        decode_sample(packed(wire))
    wire = wire_of(make_sample())
    wire["finish_reason"] = "eos"
    with pytest.raises(CodecError, match="sample.finish_reason"):
        decode_sample(packed(wire))


def test_wrong_type_names_the_field():
    wire = wire_of(make_sample())
    wire["prompt_id"] = "three"
    with pytest.raises(CodecError, match="sample.prompt_id: expected `int`, got `str`"):
        decode_sample(packed(wire))


def test_positive_logprob_is_refused():
    with pytest.raises(CodecError, match=r"sample.logprobs\[0\]"):
        validate_sample(Sample(prompt_id=1, lease_id="L", worker_id="w", prompt_tokens=[1],
                               response_tokens=[2], logprobs=[0.5], versions=[0], reward=0.0))


def test_group_with_foreign_sample_is_refused():
    wire = msgpack.unpackb(encode_batch(Batch("b", [Group(3, [make_sample(prompt_id=3)])])))
    wire["groups"][0]["samples"][0]["prompt_id"] = 4
    with pytest.raises(CodecError, match=r"batch.groups\[0\].samples: prompt_id differs"):
        decode_batch(packed(wire))
    with pytest.raises(CodecError, match="group.samples: prompt_id differs"):
        Group(3, [make_sample(prompt_id=4)])


def multi_turn_sample(mask, versions=(4, 9, 9, 5)):
    # policy tokens, then two tokens a tool inserted, then the policy again
    return Sample(prompt_id=1, lease_id="ext", worker_id="agent", prompt_tokens=[1, 4],
                  response_tokens=[6, 7, 8, 9], logprobs=[-0.1, 0.0, 0.0, -0.2],
                  versions=list(versions), reward=1.0, loss_mask=mask)


def test_loss_mask_round_trips_and_staleness_ignores_inserted_tokens():
    s = multi_turn_sample([1, 0, 0, 1], versions=(4, 0, 0, 5))
    back = decode_sample(encode(s))
    np.testing.assert_array_equal(back.loss_mask, [1, 0, 0, 1])
    assert back.oldest_version == 4  # the tool tokens' 0 does not count
    assert make_sample().loss_mask is None and make_sample().oldest_version == 5


@pytest.mark.parametrize("mask,msg", [
    ([1, 0, 1], "sample.loss_mask: 3 values for 4"),
    ([1, 0, 2, 1], r"sample.loss_mask\[2\]: 2 is outside \[0, 2\)"),
    ([1, 0, 257, 1], r"sample.loss_mask\[2\]: 257 is outside \[0, 2\)"),
    ([0, 0, 0, 0], "sample.loss_mask: no token is the policy's"),
])
def test_bad_loss_masks_are_refused_naming_the_field(mask, msg):
    with pytest.raises(CodecError, match=msg):
        validate_sample(multi_turn_sample(mask))
