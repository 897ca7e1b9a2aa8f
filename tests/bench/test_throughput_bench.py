"""bench/throughput.py's parsing and window arithmetic (no services)."""

import pytest

from bench.common import window_figures
from bench.throughput import parse_variant
from relayrl.runtime.metrics import StepFigures, StepRecord


def test_a_variant_is_a_name_and_its_overrides():
    assert parse_variant("fast=rollout.max_active_groups=8,trainer.torch_threads=2") == (
        "fast", ["rollout.max_active_groups=8", "trainer.torch_threads=2"])


@pytest.mark.parametrize("text", ["fast", "fast=", "=a.b=1", "fast=a.b", "config=a.b=1"])
def test_a_malformed_variant_is_refused(text):
    with pytest.raises(ValueError, match="--variant"):
        parse_variant(text)


def test_the_window_leaves_the_warm_up_out():
    rows = [StepRecord(s, StepFigures(elapsed_s=10.0 + (s if s <= 2 else 2 + 2 * (s - 2)),
                                      samples=64, lag_mean=float(s % 2),
                                      groups_dropped_stale=int(s == 4))) for s in range(1, 5)]
    figures = window_figures(rows, skip=2, steps=4)
    # steps 3 and 4: 128 samples in 4 s; the first two steps' 1 s each are left out
    assert figures == {"samples_per_s": 32.0, "lag_mean": 0.5, "groups_dropped_stale": 1}


def test_a_window_past_the_run_is_an_error():
    with pytest.raises(RuntimeError, match="step 9"):
        window_figures([StepRecord(1, StepFigures(elapsed_s=1.0))], skip=1, steps=9)
