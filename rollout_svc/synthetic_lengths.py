"""Synthetic response lengths for benchmarks: a seeded lognormal with a chosen median and
p99/median ratio, the shape that long-tailed RL generation has (most responses short, a few
ten times longer)."""

from __future__ import annotations

import math

import numpy as np

Z_99 = 2.3263  # the standard normal's 99th percentile


def target_length(prompt_id: int, index: int, median: int, p99_ratio: float, cap: int) -> int:
    """The length sample `index` of prompt `prompt_id` runs to, in 1..cap."""
    if median < 1 or p99_ratio < 1 or cap < 1:
        raise ValueError(f"synthetic lengths: median {median}, p99_ratio {p99_ratio} and "
                         f"cap {cap} must be >= 1")
    sigma = math.log(p99_ratio) / Z_99
    draw = np.random.default_rng([prompt_id, index, 7]).lognormal(math.log(median), sigma)
    return int(min(cap, max(1, round(draw))))
