"""The staleness rulebook: pure functions on policy versions, shared by the services and the
simulator (relayrl_sim), so both decide alike.

- `is_stale`: the trainer drops a group whose oldest token lags its version by more than
  the bound (trainer_svc.batching.split_stale; buffer_svc's Submit refuses by it too).
- `oldest_trainable`: the oldest version still trainable now.
- `oldest_startable`: the oldest weights a new prompt may start on; the scheduler hands it
  out as a lease's min_version and a worker catches up to it before starting new prompts.
- `behind`: weights a worker may start no new prompt on; under rollout.reload when_behind
  a worker holding running groups moves to newer weights only then.
- `must_restart`: a rollout worker starts over a group the trainer could no longer train,
  once its own weights are recent enough (rollout_svc's restart_stale).
- `inflight_prompts` and `may_hand_out`: the scheduler's cap on prompts out at once.

Nothing here imports anything, so any module may use it without an import circle.
"""

from __future__ import annotations

from collections.abc import Iterable


def is_stale(oldest_version: int, version: int, max_staleness: int) -> bool:
    """Tokens whose oldest version lags `version` (the trainer's, about to be updated) by
    more than `max_staleness` (trainer.max_staleness) are not trained on."""
    return version - oldest_version > max_staleness


def oldest_trainable(version: int, max_staleness: int) -> int:
    """The oldest token version the trainer at `version` still trains on."""
    return max(0, version - max_staleness)


def oldest_startable(version: int, max_staleness: int, max_start_lag: int,
                     batches_ahead: int = 0) -> int:
    """The oldest weights a worker may start a new prompt on (scheduler.max_start_lag): a
    prompt started k versions behind has only max_staleness - k steps to be trained in, so
    late starts on old weights are what the trainer drops. On the heavy tail (`relayrl
    simulate`, 1024 workers, bound 4) starting only on weights at most one version old took
    async_repack from 3.7x sync to 6.0x, the dropped share from 56% to 25%.

    A prompt with `batches_ahead` whole batches out before it is trained that many versions
    after `version` at the earliest, so it starts no older than that minus the bound (never
    newer than `version`, the newest there is). Without this, at trainer.max_staleness 1
    (two batches out) the second batch started a version behind was two behind when trained:
    the tiny example dropped 93% of its groups."""
    floor = oldest_trainable(version, min(max_start_lag, max_staleness))
    return max(floor, min(version, version + batches_ahead - max_staleness))


def behind(version: int, trainer_version: int, max_staleness: int, max_start_lag: int,
           batches_ahead: int = 0) -> bool:
    """Whether weights at `version` are too old to start a new prompt on (oldest_startable):
    a worker on them must reload before it takes prompts. The simulator's preempting worker
    (sim.tails preempt) and a live one under rollout.reload when_behind reload their running
    sequences only then, not at every newer version."""
    return version < oldest_startable(trainer_version, max_staleness, max_start_lag,
                                      batches_ahead)


def must_restart(oldest_versions: Iterable[int], engine_version: int, trainer_version: int,
                 max_staleness: int) -> bool:
    """Whether a group whose sequences' oldest token versions are `oldest_versions` (none for
    a sequence with no token yet) should start over under the engine's weights: a token is
    already too old to train on, and the engine's own tokens would be trainable. An engine
    behind the floor restarts nothing: its worker is catching up on weights."""
    floor = trainer_version - max_staleness
    if engine_version < floor:
        return False
    return any(v < floor for v in oldest_versions)


def inflight_prompts(groups_per_batch: int, max_staleness: int) -> int:
    """Prompts out at once by default (handed out, not yet consumed by the trainer): a
    prompt waits for the batches out ahead of it, so with c batches out its tokens are about
    c - 1 versions old when trained, and the long tail older. c = max_staleness leaves the
    tail room under the bound; two at least once any staleness is allowed, or generation
    would not overlap training. On bench/longtail.py at staleness 2, c = 3 dropped 13% of
    groups as stale and c = 2 none, and trained 30% more samples a second."""
    batches = 1 if max_staleness == 0 else max(2, max_staleness)
    return groups_per_batch * batches


def may_hand_out(inflight: int, max_inflight: int) -> bool:
    """Whether the scheduler may hand out one more new prompt with `inflight` out (handed
    out, neither consumed by the trainer nor failed) under the cap `max_inflight`."""
    return inflight < max_inflight
