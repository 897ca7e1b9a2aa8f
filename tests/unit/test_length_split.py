"""The length split the trainer's micro-batches and the engines' bucketed prefill share: the
cheapest cut of the rows sorted by length, every row once, each run within the budget."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl_torch.sampling.length_split import padded_cost, plan_runs


def cost(lengths, runs, pass_cost):
    return sum(padded_cost([lengths[i] for i in r], pass_cost) for r in runs)


def brute_force_best(lengths, pass_cost, max_tokens):
    """Every split of the rows sorted by decreasing length into consecutive runs."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    best = None
    for cuts in itertools.product([False, True], repeat=len(order) - 1):
        runs, current = [], [order[0]]
        for row, cut in zip(order[1:], cuts, strict=True):
            if cut:
                runs.append(current)
                current = []
            current.append(row)
        runs.append(current)
        if max_tokens is not None and any(
                len(r) > 1 and len(r) * lengths[r[0]] > max_tokens for r in runs):
            continue
        c = cost(lengths, runs, pass_cost)
        best = c if best is None else min(best, c)
    return best


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=8), st.integers(0, 200),
       st.none() | st.integers(1, 2000))
def test_the_split_is_the_cheapest_within_the_budget(lengths, pass_cost, max_tokens):
    runs = plan_runs(lengths, pass_cost, max_tokens)
    assert sorted(i for r in runs for i in r) == list(range(len(lengths)))
    for r in runs:
        assert lengths[r[0]] == max(lengths[i] for i in r)  # a run's first row is its longest
        assert max_tokens is None or len(r) == 1 or len(r) * lengths[r[0]] <= max_tokens
    assert cost(lengths, runs, pass_cost) == brute_force_best(lengths, pass_cost, max_tokens)


def test_hand_worked_splits():
    # 31 short rows and one long: one pass costs 64 + 32 x 200 = 6464; two cost
    # (64 + 200) + (64 + 31 x 10) = 638
    assert [len(r) for r in plan_runs([10] * 31 + [200], 64)] == [1, 31]
    assert len(plan_runs([10, 11, 12, 13], 64)) == 1  # padding 6 tokens beats a pass
    assert plan_runs([], 64) == []
    assert plan_runs([5] * 4, 0, max_tokens=10) == [[0, 1], [2, 3]]  # the budget cuts
