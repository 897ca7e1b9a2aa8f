"""Waiting instead of growing or failing: backoff for producers that find the buffer full,
and for any writer that Redis refuses because it reached its memory limit.

Redis configured with `maxmemory` and the `noeviction` policy answers every command that
would use memory with an OOM error while it is over the limit; reads, acknowledgements and
deletions still work, so consumers go on draining and writers only have to wait. A writer
here never drops what it was writing: it retries, with exponential backoff, until Redis
accepts it or the process is asked to stop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import redis

log = logging.getLogger(__name__)
T = TypeVar("T")

FIRST_WAIT_S = 0.05
MAX_WAIT_S = 2.0
# A write inside a Lua script reports OOM in the script error's text, not its type.
OOM_TEXT = "command not allowed when used memory > 'maxmemory'"


class StoppedWaiting(Exception):
    """The process was asked to stop while a write was waiting; nothing was written."""


def is_oom(err: Exception) -> bool:
    return isinstance(err, redis.exceptions.OutOfMemoryError) or (
        isinstance(err, redis.ResponseError) and OOM_TEXT in str(err))


class Backoff:
    """Exponential waits, FIRST_WAIT_S doubling up to MAX_WAIT_S."""

    def __init__(self, first_s: float = FIRST_WAIT_S, max_s: float = MAX_WAIT_S):
        assert 0 < first_s <= max_s
        self.first_s, self.max_s = first_s, max_s
        self.next_s = first_s

    def next_delay(self) -> float:
        delay, self.next_s = self.next_s, min(self.next_s * 2, self.max_s)
        return delay

    def wait(self, stop: threading.Event | None) -> None:
        """Sleep the next interval; StoppedWaiting if `stop` is set before or meanwhile."""
        delay = self.next_delay()
        if stop is None:
            time.sleep(delay)
        elif stop.wait(delay):
            raise StoppedWaiting

    def reset(self) -> None:
        self.next_s = self.first_s


@dataclass
class PressureCounters:
    """What a writer reports: how often and how long it waited, and why."""

    full_waits: int = 0  # writes that found the buffer at its bound
    full_wait_s: float = 0.0
    oom_refusals: int = 0  # writes Redis refused for its memory limit
    oom_wait_s: float = 0.0


def retry_on_oom(write: Callable[[], T], counters: PressureCounters, what: str,
                 stop: threading.Event | None = None) -> T:
    """`write()` until Redis accepts it. `write` must be safe to repeat after a refusal: a
    refused command, transaction or script has written nothing. Other errors propagate."""
    backoff = Backoff()
    started = None
    while True:
        try:
            result = write()
        except redis.ResponseError as err:
            if not is_oom(err):
                raise
            if started is None:
                started = time.monotonic()
                log.warning("Redis is at its memory limit; %s waits and retries: %s", what, err)
            counters.oom_refusals += 1
            t0 = time.monotonic()
            try:
                backoff.wait(stop)
            finally:
                counters.oom_wait_s += time.monotonic() - t0
            continue
        if started is not None:
            log.info("Redis accepted %s again after %.1f s", what, time.monotonic() - started)
        return result
