"""The trainer's steps as a Redis stream, so that a rollout worker waiting for room under
the scheduler's in-flight cap wakes when a step frees it instead of at its next poll.

The trainer appends one small entry per step (`announce_step`, in the transaction that
records its progress); a worker blocks on the stream (`StepWaiter.wait`) for at most the
wait the scheduler asked for, so a missed or late entry costs no more than the poll did.
With the cap binding every step (trainer.max_staleness 0) the poll's wait, 25 ms on average
of its 50, was an eighth of the tiny example's step.
"""

from __future__ import annotations

import logging
import threading

import redis

from relayrl.contracts.keys import RunKeys
from relayrl.runtime.redis_conn import without_retries

log = logging.getLogger(__name__)
KEEP = 16  # entries kept: a waiter needs only to see that one is newer than its last


def announce_step(pipe: redis.client.Pipeline, keys: RunKeys, step: int) -> None:
    pipe.xadd(keys.trainer_steps, {b"step": str(step)}, maxlen=KEEP, approximate=True)


class StepWaiter:
    """Waits for the trainer's next step announcement, or a timeout."""

    def __init__(self, r: redis.Redis, keys: RunKeys):
        self.r, self.stream = without_retries(r), keys.trainer_steps
        self.last = b"0-0"  # the first wait returns at once if the trainer has stepped

    def wait(self, timeout_s: float, stop: threading.Event) -> bool:
        """True if the trainer stepped since the last wait that saw a step; else it waited
        `timeout_s` (or until `stop`). A Redis that is away costs the timeout too, never an
        exception (its client does not reconnect: the next wait does): the worker polls the
        scheduler as before, and its appends ride the outage out."""
        ms = max(1, int(1000 * timeout_s))
        try:
            reply = self.r.xread({self.stream: self.last}, block=ms)
        except redis.RedisError as err:
            log.debug("waiting for a trainer step: %s", err)
            stop.wait(timeout_s)
            return False
        if not reply:
            return False
        _stream, entries = reply[0]
        self.last = entries[-1][0]
        return True
