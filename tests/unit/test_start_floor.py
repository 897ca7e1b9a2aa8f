"""The oldest weights a new prompt may start on (relayrl.rules.staleness.oldest_startable): a
prompt queued behind whole batches is trained that many versions later, so it must start on
weights recent enough to still be within the staleness bound then."""

import pytest

from relayrl.rules.staleness import behind, is_stale, oldest_startable


@pytest.mark.parametrize("max_staleness, ahead, floor", [
    (0, 0, 6),  # on-policy: the newest weights only
    (1, 0, 5),  # the next batch: trained at 6, one behind is within the bound
    (1, 1, 6),  # the batch after it: trained at 7, so it starts on 6
    (2, 1, 5),  # max_start_lag (1) binds before the queue does
    (4, 3, 5),
    (1, 5, 6),  # never newer than the trainer's version: there is none newer
])
def test_a_prompt_behind_whole_batches_starts_on_newer_weights(max_staleness, ahead, floor):
    assert oldest_startable(6, max_staleness, 1, ahead) == floor


@pytest.mark.parametrize("max_staleness", [1, 2, 3, 4])
def test_a_prompt_started_at_the_floor_is_trainable_when_its_batch_comes(max_staleness):
    """With the default cap (relayrl.rules.staleness.inflight_prompts: max(2, bound) batches), a
    prompt started on the floor's weights is never stale by the time its batch trains."""
    batches_out = max(2, max_staleness)
    for version in range(0, 10):
        for ahead in range(batches_out):
            start = oldest_startable(version, max_staleness, max_staleness, ahead)
            assert not is_stale(start, version + ahead, max_staleness)


def test_behind_counts_the_batches_ahead():
    assert not behind(5, 6, 1, 1)
    assert behind(5, 6, 1, 1, batches_ahead=1)
