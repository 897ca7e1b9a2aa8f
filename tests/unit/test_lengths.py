from types import SimpleNamespace

import numpy as np
import pytest

from relayrl.config import RunConfig
from relayrl.contracts.partial import PartialGroup, PartialSequence
from rollout_svc.group_generator import GroupGenerator
from rollout_svc.synthetic_lengths import target_length


def test_lengths_are_seeded_capped_and_heavy_tailed():
    draws = [target_length(p, i, median=20, p99_ratio=10.0, cap=10_000)
             for p in range(2000) for i in range(4)]
    assert draws == [target_length(p, i, 20, 10.0, 10_000) for p in range(2000) for i in range(4)]
    median, p99 = np.percentile(draws, [50, 99])
    assert 18 <= median <= 22 and 8 <= p99 / median <= 12
    assert max(target_length(p, 0, 20, 10.0, cap=50) for p in range(500)) == 50
    assert min(draws) >= 1


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="median 0"):
        target_length(0, 0, median=0, p99_ratio=10, cap=8)


def test_a_worker_draws_its_lengths_from_the_bench_section():
    """bench.synthetic_length_median set, each sample runs to its drawn length (capped by
    rollout.max_new_tokens); unset, to rollout.max_new_tokens."""
    group = PartialGroup(3, [1, 2], [PartialSequence() for _ in range(4)])
    engine = SimpleNamespace(version=0, context_length=256)
    cfg = RunConfig.model_validate({"rollout": {"max_new_tokens": 64},
                                    "bench": {"synthetic_length_median": 8,
                                              "synthetic_length_p99_ratio": 4.0}})
    gen = GroupGenerator(cfg.rollout_part(), engine, lm=None, writer=None)
    assert [gen._limit(group, i) for i in range(4)] == [target_length(3, i, 8, 4.0, 64)
                                                        for i in range(4)]
    plain_cfg = RunConfig.model_validate({"rollout": {"max_new_tokens": 64}})
    plain = GroupGenerator(plain_cfg.rollout_part(), engine, lm=None, writer=None)
    assert [plain._limit(group, i) for i in range(4)] == [64] * 4
