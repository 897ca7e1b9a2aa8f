"""The per-step staleness histogram: samples counted by the lag of their oldest token."""

import pytest

from relayrl.contracts.messages import Batch, Group, Sample
from trainer_svc.batching import lag_histogram, split_stale, token_lag_histogram

pytestmark = pytest.mark.unit


def group(prompt_id: int, versions: list[list[int]]) -> Group:
    """One sample per entry of `versions`, whose tokens carry those version tags."""
    return Group(prompt_id, [
        Sample(prompt_id=prompt_id, lease_id="L", worker_id="w", prompt_tokens=[1],
               response_tokens=[2] * len(v), logprobs=[-1.0] * len(v), versions=v, reward=0.0)
        for v in versions])


def test_samples_fall_in_the_bucket_of_their_groups_oldest_token():
    # trainer at version 10, bound 3: a group's lag is set by its oldest token anywhere in it
    batch = Batch("b", [group(1, [[10, 10], [10]]),      # lag 0, 2 samples
                        group(2, [[9, 10], [8, 10, 10]]),  # oldest 8: lag 2, 2 samples
                        group(3, [[7]]),                    # lag 3: the bound, kept
                        group(4, [[5, 10], [10]])])         # lag 5: over, 2 samples dropped
    hist = lag_histogram(batch, 10, 3)
    assert hist == {"staleness/samples_lag_0": 2, "staleness/samples_lag_1": 0,
                    "staleness/samples_lag_2": 2, "staleness/samples_lag_3": 1,
                    "staleness/samples_lag_over": 2}
    split = split_stale(batch, 10, 3)
    assert hist["staleness/samples_lag_over"] == sum(len(g.samples) for g in split.stale)


def test_a_large_bound_keeps_the_bucket_count_small():
    batch = Batch("b", [group(1, [[0]]), group(2, [[50]]), group(3, [[91]]), group(4, [[100]])])
    hist = lag_histogram(batch, 100, 60)
    assert len(hist) == 11  # lags 0-8, 9 up to the bound, over
    assert hist["staleness/samples_lag_0"] == 1
    assert hist["staleness/samples_lag_9plus"] == 2  # lags 9 and 50
    assert hist["staleness/samples_lag_over"] == 1
    assert sum(hist.values()) == 4


def test_tokens_fall_in_the_bucket_of_their_own_lag():
    """Per token, a sample whose weights moved mid-sequence is only partly as old as its
    oldest token; the sample histogram puts all of it at that lag."""
    kept = split_stale(Batch("b", [group(1, [[8, 9, 10, 10], [10]]), group(2, [[2]])]),
                       10, 3).kept
    hist = token_lag_histogram(kept, 10, 3)
    assert hist == {"staleness/tokens_lag_0": 3, "staleness/tokens_lag_1": 1,
                    "staleness/tokens_lag_2": 1, "staleness/tokens_lag_3": 0,
                    "staleness/tokens_lag_over": 0}


def test_token_lags_share_the_sample_buckets_past_eight_and_the_bound():
    # trainer at 100, bound 60: lags 0, 9 and 50 in one sequence, 70 (over) in another
    groups = [group(1, [[100, 91, 50, 50]]), group(2, [[30, 100]])]
    hist = token_lag_histogram(groups, 100, 60)
    assert len(hist) == 11
    assert hist["staleness/tokens_lag_0"] == 2
    assert hist["staleness/tokens_lag_9plus"] == 3
    assert hist["staleness/tokens_lag_over"] == 1
    assert sum(hist.values()) == 6
    assert token_lag_histogram([], 100, 60) == dict.fromkeys(hist, 0)
