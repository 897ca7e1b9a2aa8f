"""Knobs only benchmarks and the simulator set: no production run needs them."""

from __future__ import annotations

from pydantic import Field

from relayrl.config.base import StrictModel


class BenchConfig(StrictModel):
    synthetic_length_median: int = Field(
        0, ge=0, le=65_536,
        description="Benchmarks: give each response a length drawn from a lognormal with this "
        "median (seeded by prompt and sample, capped by rollout.max_new_tokens), ignoring "
        "end-of-sequence; 0 lets the model decide.",
    )
    synthetic_length_p99_ratio: float = Field(
        10.0, ge=1.0, le=1000.0,
        description="p99 / median of the synthetic lengths: 10 is a heavy tail.",
    )
