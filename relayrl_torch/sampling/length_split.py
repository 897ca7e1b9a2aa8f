"""Rows of very different lengths split into runs of like length, one model pass per run.

A pass over rows padded to the longest costs rows x longest tokens; a long tail makes that
mostly padding. Sorted by length and cut into consecutive runs, the rows cost little more
than their real tokens plus a fixed cost per extra pass. The trainer's micro-batches
(trainer_svc/micro_batches.py) and the sampler's bucketed prefill
(relayrl_torch/sampling/prefill.py) both split this way, each with the pass cost measured for its
own kind of pass.
"""

from __future__ import annotations

import numpy as np


def plan_runs(lengths: list[int], pass_cost: int, max_tokens: int | None = None
              ) -> list[list[int]]:
    """Row indices by decreasing length, cut into consecutive runs minimising the sum over
    runs of pass_cost + rows x longest row; with `max_tokens`, no run of more than one row
    exceeds that many padded tokens. Each run's first row is its longest."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if len(order) <= 1:
        return [order] if order else []
    longest = np.array([lengths[i] for i in order], dtype=np.int64)
    n = len(order)
    best = np.full(n + 1, np.inf)  # best[b]: cheapest split of the first b rows
    best[0] = 0.0
    start = np.zeros(n + 1, dtype=np.int64)  # where the last run of that split starts
    for end in range(1, n + 1):
        a = np.arange(end)  # candidate starts of the last run, rows a..end-1
        rows = end - a
        padded = rows * longest[a]
        cost = best[:end] + padded + pass_cost
        if max_tokens is not None:
            cost[(padded > max_tokens) & (rows > 1)] = np.inf
        start[end] = int(np.argmin(cost))
        best[end] = cost[start[end]]
    runs, end = [], n
    while end > 0:
        runs.append(order[start[end]:end])
        end = int(start[end])
    return runs[::-1]


def padded_cost(lengths: list[int], pass_cost: int) -> int:
    """What one pass over `lengths` padded to the longest costs, in padded tokens."""
    return pass_cost + len(lengths) * max(lengths) if lengths else 0
