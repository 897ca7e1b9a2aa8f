"""Riding out a peer's outage instead of ending the process.

A call to Redis, the scheduler or a relay that fails because the peer is unreachable or hung
(a refused or dropped connection, a command or RPC past its deadline) is tried again after
a wait drawn with full jitter from an exponentially growing range, capped at MAX_WAIT_S,
for as long as the peer stays away (or `give_up_s`, where a caller sets one). While any
call of the process waits, the process reports itself unready (`readiness`: gRPC health
NOT_SERVING and /healthz 503, see relayrl.runtime.service); the wait is logged once when it begins
and once when the peer answers again.

A peer holding as many calls as its gRPC server takes (GrpcLimits.max_concurrent_rpcs) is
waited out the same way: its refusal comes before the call runs. A message over the peer's
size limit is refused with the same code, RESOURCE_EXHAUSTED, and is no outage: sent again,
it would be refused again.

A retried call must be safe to repeat: a Redis command or an RPC that timed out may have
been applied all the same.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import grpc
import redis

from relayrl.runtime.backpressure import Backoff, PressureCounters, StoppedWaiting, retry_on_oom

log = logging.getLogger(__name__)
T = TypeVar("T")

FIRST_WAIT_S = 0.1
MAX_WAIT_S = 5.0
GRPC_OUTAGE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# how grpc's Python server refuses a call over its maximum_concurrent_rpcs
BUSY_DETAILS = "Concurrent RPC limit exceeded"


def is_busy(err: grpc.RpcError) -> bool:
    """The server refused the call, before running it, for holding too many at once."""
    details = getattr(err, "details", None)
    return (err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and callable(details)
            and (details() or "").startswith(BUSY_DETAILS))


def is_too_large(err: grpc.RpcError) -> bool:
    """The message was over a size limit (the peer's receive or this channel's send limit):
    the same message is refused every time."""
    details = getattr(err, "details", None)
    return (err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and callable(details)
            and "larger than max" in (details() or ""))


def is_outage(err: BaseException) -> bool:
    """The peer is away or hung, as opposed to refusing this call: worth waiting out. An
    error raised `from` one (a relay call's WeightError) is one too."""
    if isinstance(err, (redis.AuthenticationError, redis.exceptions.AuthorizationError)):
        return False  # a wrong password: waiting will not change it
    if isinstance(err, (redis.ConnectionError, redis.TimeoutError)):
        return True
    code = getattr(err, "code", None) if isinstance(err, grpc.RpcError) else None
    if callable(code):
        return code() in GRPC_OUTAGE or is_busy(err)
    return err.__cause__ is not None and is_outage(err.__cause__)


def describe(err: BaseException) -> str:
    code = getattr(err, "code", None)
    if isinstance(err, grpc.RpcError) and callable(code):
        return code().name
    return f"{type(err).__name__}: {err}"


class JitteredBackoff(Backoff):
    """Full jitter: each wait is drawn uniformly from [0, the capped exponential bound], so
    many clients that lost the same peer do not all come back at the same instant."""

    def __init__(self, first_s: float = FIRST_WAIT_S, max_s: float = MAX_WAIT_S,
                 draw: Callable[[], float] = random.random):
        super().__init__(first_s, max_s)
        self.draw = draw

    def next_delay(self) -> float:
        return self.draw() * super().next_delay()


class Readiness:
    """The peers the process is waiting for; ready while there are none. Listeners hear each
    change between ready and unready (in order: they are called under the lock)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waits: Counter[str] = Counter()
        self._listeners: list[Callable[[bool], None]] = []

    @property
    def ready(self) -> bool:
        return not self._waits

    def waiting_on(self) -> list[str]:
        with self._lock:
            return sorted(self._waits)

    def subscribe(self, listener: Callable[[bool], None]) -> None:
        """Also tells `listener` the state now."""
        with self._lock:
            self._listeners.append(listener)
            listener(self.ready)

    def unsubscribe(self, listener: Callable[[bool], None]) -> None:
        with self._lock:
            self._listeners.remove(listener)

    def enter(self, peer: str) -> None:
        with self._lock:
            if not self._waits:
                self._notify(False)
            self._waits[peer] += 1

    def leave(self, peer: str) -> None:
        with self._lock:
            assert self._waits[peer] > 0, f"left a wait for {peer} never entered"
            self._waits[peer] -= 1
            if not self._waits[peer]:
                del self._waits[peer]
            if not self._waits:
                self._notify(True)

    def _notify(self, ready: bool) -> None:
        for listener in self._listeners:
            listener(ready)


readiness = Readiness()  # the process's: one process serves one service


class Outage:
    """One caller's view of one peer it keeps calling. `failed` (on an error that is_outage)
    returns how long to wait before the next try; the first logs the wait and makes the
    process unready. `recovered` (on the next success) logs the recovery and makes it ready
    again. For loops that go on with other work between tries; ride_out is the blocking
    form. Thread-safe: two threads calling the same peer may share one."""

    def __init__(self, peer: str, backoff: Backoff | None = None, board: Readiness = readiness):
        self.peer = peer
        self.backoff = backoff or JitteredBackoff()
        self.board = board
        self.since: float | None = None
        self.tries = 0
        self.outages = 0  # waits begun, for a service's figures
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self.since is not None

    def elapsed_s(self) -> float:
        since = self.since
        return 0.0 if since is None else time.monotonic() - since

    def failed(self, err: BaseException) -> float:
        with self._lock:
            if self.since is None:
                self.since, self.tries = time.monotonic(), 0
                self.outages += 1
                self.board.enter(self.peer)
                log.warning("%s unreachable (%s); waiting for it, retrying with backoff "
                            "(at most %.0f s apart)", self.peer, describe(err),
                            self.backoff.max_s)
            self.tries += 1
            return self.backoff.next_delay()

    def recovered(self) -> None:
        self._end(log_it=True)

    def abandon(self) -> None:
        """Stop waiting without having reached the peer (the caller stops or gives up)."""
        self._end(log_it=False)

    def _end(self, log_it: bool) -> None:
        with self._lock:
            if self.since is None:
                return
            if log_it:
                log.info("%s is back after %.1f s (%d tries)", self.peer,
                         time.monotonic() - self.since, self.tries)
            self.since = None
            self.backoff.reset()
            self.board.leave(self.peer)


def pause(delay_s: float, stop: threading.Event | None) -> None:
    """Sleep; StoppedWaiting if `stop` is set before or meanwhile."""
    if stop is None:
        time.sleep(delay_s)
    elif stop.wait(delay_s):
        raise StoppedWaiting


def ride_out(peer: str, call: Callable[[], T], stop: threading.Event | None = None,
             give_up_s: float | None = None) -> T:
    """`call()` until it returns, waiting out failures that is_outage; other errors propagate.
    StoppedWaiting if `stop` is set during a wait; the last error after `give_up_s`."""
    outage = Outage(peer)
    try:
        while True:
            try:
                result = call()
            except Exception as err:
                if not is_outage(err):
                    raise
                delay = outage.failed(err)
                if give_up_s is not None and outage.elapsed_s() >= give_up_s:
                    raise
                pause(delay, stop)
                continue
            outage.recovered()
            return result
    finally:
        outage.abandon()


def redis_write(write: Callable[[], T], counters: PressureCounters, what: str,
                stop: threading.Event | None = None) -> T:
    """`write()` through a Redis outage and Redis's memory limit (retry_on_oom). `write`
    must be idempotent: after a timeout it may have been applied."""
    return ride_out("redis", lambda: retry_on_oom(write, counters, what, stop), stop)
