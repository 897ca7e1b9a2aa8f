import numpy as np
import pytest

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
