"""Sequence KV states: the wire codec, per-sequence cut and batch assembly, the LRU cache, and
resuming the sampler from states."""

from dataclasses import replace

import msgpack
import pytest
import torch

from relayrl.contracts.codec import CodecError
from relayrl_torch.sampling.kv_batch import assemble, split
from relayrl_torch.sampling.kv_state import ModelFingerprint, SequenceKV, StateCache, checksum_of
from relayrl_torch.sampling.sampler import sample_with_kv

FP = ModelFingerprint("llama", num_layers=2, kv_heads=2, head_dim=4, hidden_size=8,
                      vocab_size=15, dtype="float32")


def random_state(n: int, fp: ModelFingerprint = FP, version: int = 3, first: int = 3):
    shape = (fp.num_layers, fp.kv_heads, n, fp.head_dim)
    dtype = getattr(torch, fp.dtype)
    return SequenceKV(tuple(range(first, first + n)), version, fp,
                      torch.randn(shape).to(dtype), torch.randn(shape).to(dtype))


def prompts_of(lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 15, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_codec_round_trip(dtype):
    state = random_state(5, replace(FP, dtype=dtype))
    back = SequenceKV.decode(state.encode())
    assert (back.tokens, back.version, back.fingerprint) == (
        state.tokens, state.version, state.fingerprint)
    assert torch.equal(back.keys, state.keys) and torch.equal(back.values, state.values)


def test_codec_names_the_bad_field():
    payload = random_state(5).encode()
    with pytest.raises(CodecError, match="msgpack"):
        SequenceKV.decode(payload[: len(payload) // 2])

    def tampered(checksum: bool = True, **changes) -> bytes:
        """The payload with fields changed, its checksum recomputed unless told not to."""
        obj = msgpack.unpackb(payload, raw=False)
        for path, value in changes.items():
            *parents, leaf = path.split("__")
            target = obj
            for p in parents:
                target = target[p]
            target[leaf] = value
        if checksum:
            obj["checksum"] = checksum_of({k: obj[k] for k in ("tokens", "keys", "values")})
        return msgpack.packb(obj, use_bin_type=True)

    cases = {
        "sequence_kv.keys.data": tampered(keys__data=b"\0" * 7),
        "sequence_kv.values": tampered(values__shape=[2, 2, 4, 16], values__data=b"\0" * 256),
        "sequence_kv.keys": tampered(tokens__shape=[4], tokens__data=b"\0" * 32),
        "sequence_kv.fingerprint.kv_heads": tampered(fingerprint__kv_heads="2"),
        "sequence_kv.fingerprint.dtype": tampered(fingerprint__dtype="int8"),
        "sequence_kv.version": tampered(version=-1),
        "kind": tampered(kind="partial_group"),
        "sequence_kv.checksum": tampered(checksum=False, keys__data=b"\1" * 128),
    }
    for field, bad in cases.items():
        with pytest.raises(CodecError, match=field):
            SequenceKV.decode(bad)


def test_a_state_refuses_another_model_or_version():
    state = random_state(4)
    with pytest.raises(ValueError, match="num_layers 2 != 3"):
        state.check_fits(replace(FP, num_layers=3), 3)
    with pytest.raises(ValueError, match="version 3, the model holds 4"):
        state.check_fits(FP, 4)
    with pytest.raises(ValueError, match="keys is"):
        SequenceKV((1, 2), 0, FP, state.keys, state.values)


def test_assemble_then_split_gives_back_each_state():
    states = [random_state(3), None, random_state(6, first=9)]
    batched = assemble(states, FP)
    assert batched.mask.tolist() == [[0, 0, 0, 1, 1, 1], [0] * 6, [1] * 6]
    assert batched.next_positions.tolist() == [3, 0, 6]
    both = [states[0], states[2]]
    batched = assemble(both, FP)
    back = split(batched.cache, batched.mask, [list(s.tokens) for s in both], 3, FP)
    for got, want in zip(back, both, strict=True):
        assert (got.tokens, got.version) == (want.tokens, 3)
        assert torch.equal(got.keys, want.keys) and torch.equal(got.values, want.values)
    assert assemble([None, None], FP) is None
    with pytest.raises(ValueError, match=r"states\[0\]: computed by another model"):
        assemble([random_state(2, replace(FP, head_dim=8))], FP)


def test_state_cache_evicts_least_recently_used_by_tokens():
    cache = StateCache(10)
    a, b, c = random_state(4, first=3), random_state(4, first=20), random_state(4, first=40)
    assert cache.put(a) and cache.put(b)
    assert cache.longest_prefix(list(a.tokens) + [99]) is a  # refreshes a
    assert cache.put(c)
    assert cache.longest_prefix(list(b.tokens) + [99]) is None  # b was least recent
    assert cache.longest_prefix(list(a.tokens)) is a and cache.tokens_held == 8
    assert not cache.put(random_state(11)) and len(cache) == 2
    assert cache.longest_prefix(list(a.tokens)[:2]) is None
    with pytest.raises(ValueError, match="kv_cache_tokens"):
        StateCache(-1)


def test_state_cache_finds_a_shorter_prefix_the_longest_first():
    """An episode's next turn: the previous turn's state, then the environment's tokens."""
    cache = StateCache(100)
    a = random_state(4, first=3)
    longer = random_state(6, first=3)  # a's tokens, then two more
    assert longer.tokens[:4] == a.tokens
    assert cache.put(a) and cache.put(random_state(4, first=40))
    assert cache.longest_prefix(list(a.tokens) + [90, 91, 92]) is a
    assert cache.put(longer)
    assert cache.longest_prefix(list(longer.tokens) + [90, 91, 92]) is longer
    assert cache.longest_prefix([3, 90, 91]) is None


def test_sampling_resumes_from_states_exactly(tiny_lm):
    prompts = prompts_of((5, 12, 3, 9))
    kw = dict(eos_ids=(), pad_id=tiny_lm.pad_id, greedy=True)
    whole, _ = sample_with_kv(tiny_lm.model, prompts, max_new_tokens=10, **kw)
    head, states = sample_with_kv(tiny_lm.model, prompts, max_new_tokens=4, return_states=True,
                                  version=7, **kw)
    contexts = [p + o.tokens for p, o in zip(prompts, head, strict=True)]
    assert [s.tokens for s in states] == [tuple(c[:-1]) for c in contexts]
    assert {s.version for s in states} == {7}
    # Row 1 prefills, row 3 resumes from a state covering its whole context.
    full = sample_with_kv(tiny_lm.model, [contexts[3]], max_new_tokens=1, states=[states[3]],
                          return_states=True, **kw)[1][0].prefix(len(contexts[3]))
    tail, _ = sample_with_kv(tiny_lm.model, contexts, max_new_tokens=6,
                             states=[states[0], None, states[2], full], **kw)
    for w, h, t in zip(whole, head, tail, strict=True):
        assert w.tokens == h.tokens + t.tokens
        assert w.logprobs == pytest.approx(h.logprobs + t.logprobs, abs=1e-5)
    with pytest.raises(ValueError, match=r"states\[0\]: its 8 tokens are not a prefix"):
        sample_with_kv(tiny_lm.model, [prompts[0]], max_new_tokens=1, states=[states[0]], **kw)


def test_finished_rows_leave_only_their_real_tokens_in_the_state(tiny_lm):
    prompts = prompts_of((4, 7), seed=1)
    outs, states = sample_with_kv(tiny_lm.model, prompts, max_new_tokens=6, eos_ids=(),
                                  pad_id=tiny_lm.pad_id, greedy=True, return_states=True)
    eos = outs[0].tokens[1]  # treat row 0's second token as end-of-sequence
    outs, states = sample_with_kv(tiny_lm.model, prompts, max_new_tokens=6, eos_ids=(eos,),
                                  pad_id=tiny_lm.pad_id, greedy=True, return_states=True)
    assert outs[0].finish_reason == "stop"
    for p, o, s in zip(prompts, outs, states, strict=True):
        assert s.tokens == tuple(p + o.tokens[:-1])
