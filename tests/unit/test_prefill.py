"""Prefill in length buckets: the plan is the cheapest split of the sorted lengths, and
sampling after a bucketed prefill gives what each sequence gives alone."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl import prefill
from relayrl.generation import sample_with_kv
from relayrl.prefill import padded_cost, plan_buckets


def brute_force_cost(lengths: list[int], call_cost: int) -> int:
    """Every way to cut the sorted lengths into consecutive calls."""
    keys = sorted(lengths)
    best = None
    for cuts in itertools.product([False, True], repeat=len(keys) - 1):
        cost, start = 0, 0
        for j, cut in enumerate([*cuts, True]):
            if cut:
                cost += call_cost + (j + 1 - start) * keys[j]
                start = j + 1
        best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=9), st.integers(0, 200))
def test_the_plan_is_the_cheapest_split_and_covers_every_row_once(lengths, call_cost):
    buckets = plan_buckets(lengths, call_cost)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    cost = sum(padded_cost([lengths[i] for i in b], call_cost) for b in buckets)
    assert cost == brute_force_cost(lengths, call_cost)
    for b in buckets:  # rows of one length are never split over calls
        assert not any(lengths[i] in {lengths[j] for j in b} for other in buckets
                       if other is not b for i in other)


def test_hand_worked_plans():
    # 31 short rows and one long: one padded call costs 64 + 32 x 200 = 6464; two calls
    # cost (64 + 31 x 10) + (64 + 200) = 638
    assert sorted(map(len, plan_buckets([10] * 31 + [200], 64))) == [1, 31]
    assert len(plan_buckets([10, 11, 12, 13], 64)) == 1  # padding 6 tokens beats a call
    assert plan_buckets([], 64) == []
    assert len(plan_buckets(list(range(1, 2000)), 64)) > 1  # many lengths: rounded, planned


def test_sampling_after_a_bucketed_prefill_matches_each_sequence_alone(tiny_lm):
    gen = torch.Generator().manual_seed(0)
    contexts = [torch.randint(3, 12, (n,), generator=gen).tolist() for n in [5] * 6 + [120]]
    kw = dict(max_new_tokens=6, eos_id=-1, pad_id=tiny_lm.pad_id, greedy=True)
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
        sample_with_kv(tiny_lm.model, [[3] * 5, [4] * 120], max_new_tokens=2, eos_id=-1,
                       pad_id=tiny_lm.pad_id, greedy=True)
    finally:
        hook.remove()
    assert widths[0] == (2, 120)
