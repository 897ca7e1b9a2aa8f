import msgpack
import numpy as np
import pytest

from relayrl.codec import CodecError, decode_array, encode_array, pack
from relayrl.messages import (
    Batch,
    Group,
    Sample,
    decode_batch,
    decode_sample,
    encode_batch,
    encode_sample,
)


def make_sample(prompt_id=3, n=3, version=5):
    return Sample(prompt_id=prompt_id, lease_id="L1", worker_id="rollout-0",
                  prompt_tokens=[1, 4, 5], response_tokens=list(range(6, 6 + n)),
                  logprobs=[-0.5] * n, versions=[version] * n, reward=1.0)


def test_sample_round_trip():
    s = make_sample()
    back = decode_sample(encode_sample(s))
    for name in ("prompt_tokens", "response_tokens", "logprobs", "versions"):
        np.testing.assert_array_equal(getattr(back, name), getattr(s, name))
    assert (back.prompt_id, back.lease_id, back.reward) == (3, "L1", 1.0)


def test_batch_round_trip():
    b = Batch("b1", [Group(3, [make_sample(), make_sample(version=2)]), Group(4, [make_sample(4)])])
    back = decode_batch(encode_batch(b))
    assert [g.prompt_id for g in back.groups] == [3, 4]
    assert back.groups[0].oldest_version == 2
    assert back.num_samples == 3


def test_array_round_trip_keeps_dtype_and_shape():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    back = decode_array(encode_array(a), "x")
    assert back.dtype == np.float32 and back.shape == (3, 4)
    np.testing.assert_array_equal(back, a)


@pytest.mark.parametrize("payload,field", [
    (b"\xc1\xff", "msgpack"),
    (msgpack.packb({"schema": 99, "kind": "sample"}), "schema"),
    (msgpack.packb({"schema": 1, "kind": "batch"}), "kind"),
    (msgpack.packb([1, 2]), "map"),
])
def test_bad_envelopes_are_refused_with_the_field(payload, field):
    with pytest.raises(CodecError, match=field):
        decode_sample(payload)


def test_mismatched_lengths_name_the_field():
    wire = make_sample().to_wire()
    wire["logprobs"] = encode_array(np.zeros(2, dtype=np.float32))
    with pytest.raises(CodecError, match="sample.logprobs"):
        decode_sample(pack("sample", wire))


def test_truncated_array_data_names_the_field():
    wire = make_sample().to_wire()
    wire["versions"]["data"] = wire["versions"]["data"][:-3]
    with pytest.raises(CodecError, match="sample.versions.data"):
        decode_sample(pack("sample", wire))


def test_wrong_type_names_the_field():
    wire = make_sample().to_wire()
    wire["prompt_id"] = "three"
    with pytest.raises(CodecError, match="sample.prompt_id"):
        decode_sample(pack("sample", wire))


def test_positive_logprob_is_refused():
    with pytest.raises(CodecError, match="sample.logprobs"):
        make_sample().__class__(prompt_id=1, lease_id="L", worker_id="w", prompt_tokens=[1],
                                response_tokens=[2], logprobs=[0.5], versions=[0], reward=0.0)


def test_group_with_foreign_sample_is_refused():
    b = Batch("b", [Group(3, [make_sample(prompt_id=4)])])
    with pytest.raises(CodecError, match=r"batch.groups\[0\].samples"):
        decode_batch(encode_batch(b))


def multi_turn_sample(mask, versions=(4, 9, 9, 5)):
    # policy tokens, then two tokens a tool inserted, then the policy again
    return Sample(prompt_id=1, lease_id="ext", worker_id="agent", prompt_tokens=[1, 4],
                  response_tokens=[6, 7, 8, 9], logprobs=[-0.1, 0.0, 0.0, -0.2],
                  versions=list(versions), reward=1.0, loss_mask=mask)


def test_loss_mask_round_trips_and_staleness_ignores_inserted_tokens():
    s = multi_turn_sample([1, 0, 0, 1], versions=(4, 0, 0, 5))
    back = decode_sample(encode_sample(s))
    np.testing.assert_array_equal(back.loss_mask, [1, 0, 0, 1])
    assert back.oldest_version == 4  # the tool tokens' 0 does not count
    assert make_sample().loss_mask is None and make_sample().oldest_version == 5


@pytest.mark.parametrize("mask,msg", [
    ([1, 0, 1], "sample.loss_mask: 3 values for 4"),
    ([1, 0, 2, 1], "sample.loss_mask: values must be 0 or 1"),
    ([0, 0, 0, 0], "sample.loss_mask: no token is the policy's"),
])
def test_bad_loss_masks_are_refused_naming_the_field(mask, msg):
    with pytest.raises(CodecError, match=msg):
        multi_turn_sample(mask)
