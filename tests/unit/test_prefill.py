"""Prefill in length buckets (the split itself: test_length_split.py): chosen only when it
beats one padded forward, and sampling after it gives what each sequence gives alone."""

from __future__ import annotations

import pytest
import torch

from relayrl_torch.sampling import prefill
from relayrl_torch.sampling.prefill import worth_bucketing
from relayrl_torch.sampling.sampler import sample_with_kv


def test_bucketing_is_chosen_only_when_it_beats_one_padded_forward():
    # 31 fresh ten-token rows and one of 200: buckets then one token each beat 32 x 200
    fed = [10] * 31 + [200]
    assert worth_bucketing(fed, list(range(32)), [n - 1 for n in fed])
    # like lengths: one padded forward is cheaper than a second call
    assert not worth_bucketing([10, 12, 11], [0, 1, 2], [9, 11, 10])


def test_sampling_after_a_bucketed_prefill_matches_each_sequence_alone(tiny_lm):
    gen = torch.Generator().manual_seed(0)
    contexts = [torch.randint(3, 12, (n,), generator=gen).tolist() for n in [5] * 6 + [120]]
    kw = dict(max_new_tokens=6, eos_ids=(), pad_id=tiny_lm.pad_id, greedy=True)
    widths = []
    hook = tiny_lm.model.register_forward_pre_hook(
        lambda mod, args, kwargs: widths.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True)
    try:
        together, _ = sample_with_kv(tiny_lm.model, contexts, **kw)
    finally:
        hook.remove()
    # the six short contexts in one call, the long one alone, then one token per row
    assert sorted(widths[:2]) == [(1, 119), (6, 4)], widths
    assert widths[2] == (7, 1)
    for context, out in zip(contexts, together, strict=True):
        (alone,), _ = sample_with_kv(tiny_lm.model, [context], **kw)
        assert out.tokens == alone.tokens
        assert out.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_a_prefill_not_worth_a_second_call_stays_one_padded_forward(tiny_lm, monkeypatch):
    widths = []
    hook = tiny_lm.model.register_forward_pre_hook(
        lambda mod, args, kwargs: widths.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True)
    monkeypatch.setattr(prefill, "CALL_COST_TOKENS", 10**6)
    try:
        sample_with_kv(tiny_lm.model, [[3] * 5, [4] * 120], max_new_tokens=2, eos_ids=(),
                       pad_id=tiny_lm.pad_id, greedy=True)
    finally:
        hook.remove()
    assert widths[0] == (2, 120)
