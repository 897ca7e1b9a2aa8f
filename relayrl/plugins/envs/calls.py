"""A user's environment calls, each on its own thread and waited for with a deadline.

A Python call cannot be killed: an environment's `reset` or `step` that runs past its
deadline is abandoned (its episode ends with an error) and goes on running on its thread
until it returns. `EnvCalls` counts such calls; while `max_stuck` of them are still running,
it refuses new ones (each refused call ends its episode the same way), so a hung environment
costs at most that many threads, never a slower run.

    calls = EnvCalls(max_stuck=64)
    handles = [calls.start(fn) for fn in fns]         # all running at once
    results = [calls.wait(h, timeout_s) for h in handles]  # Done(value) / Overran / Refused
    calls.due(h, timeout_s)                           # would wait(h) return at once?
    calls.drop(h)                                     # nobody will wait for it

The waits of calls started together overlap: a batch of slow calls costs one deadline, not
their sum. Threads are kept for reuse once their call returns (up to IDLE_THREADS idle), so
a fast environment costs no thread start per call; they are daemon threads, so a call still
stuck when the process ends does not hold it up.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

IDLE_THREADS = 256  # threads kept waiting for the next call, at most
POLL_S = 0.01  # how often settle looks at its calls


class Done(NamedTuple):
    """A call that returned: its value, or the error it raised."""
    value: Any = None
    error: BaseException | None = None  # what the call raised


class Overran(NamedTuple):
    """The call was still running at its deadline; it was abandoned."""


class Refused(NamedTuple):
    """Not started: too many earlier calls are still running past their deadlines."""

    stuck: int


class Handle:
    """A call handed to a thread, to be waited for with a deadline."""
    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn
        self.started = time.monotonic()
        self.finished = threading.Event()
        self.abandoned = False
        self.outcome: Done | None = None


class EnvCalls:
    """Runs environment calls on threads with deadlines, refusing new ones while too many
    are stuck past theirs."""
    def __init__(self, max_stuck: int, field: str = "rollout.environment.max_stuck_calls"):
        assert max_stuck >= 1
        self.max_stuck = max_stuck
        self.field = field  # the setting of max_stuck, for the log
        self.stuck = 0  # abandoned calls still running
        self.overruns = 0  # calls abandoned at their deadline, ever
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Handle]] = []  # each an idle thread's inbox

    def start(self, fn: Callable[[], Any]) -> Handle | Refused:
        """Run `fn` on an idle thread (or a new one) and return its handle to wait on with a
        deadline; `Refused` while `max_stuck` calls are still running past theirs."""
        with self._lock:
            if self.stuck >= self.max_stuck:
                return Refused(self.stuck)
            inbox = self._idle.pop() if self._idle else None
        handle = Handle(fn)
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="environment-call",
                             daemon=True).start()
        inbox.put(handle)
        return handle

    def _serve(self, inbox: queue.SimpleQueue[Handle]) -> None:
        """Run the calls put in `inbox`, one at a time; offer itself again after each."""
        while True:
            self._run(inbox.get())
            with self._lock:
                if len(self._idle) >= IDLE_THREADS:
                    return
                self._idle.append(inbox)

    def _run(self, handle: Handle) -> None:
        try:
            outcome = Done(handle.fn())
        except BaseException as err:  # a user's environment may raise anything
            outcome = Done(None, err)
        with self._lock:
            handle.outcome = outcome
            handle.finished.set()
            if handle.abandoned:
                self.stuck -= 1
                handle.outcome = None  # nobody reads it: let it go

    def wait(self, handle: Handle | Refused, timeout_s: float) -> Done | Overran | Refused:
        """The call's outcome, or Overran once `timeout_s` from its start has passed."""
        if isinstance(handle, Refused):
            return handle
        handle.finished.wait(max(0.0, handle.started + timeout_s - time.monotonic()))
        with self._lock:
            if handle.finished.is_set():
                assert handle.outcome is not None
                return handle.outcome
            self.overruns += 1
            stuck = self._abandon(handle)
        self._warn_if_full(stuck)
        return Overran()

    def drop(self, handle: Handle | Refused) -> None:
        """Nobody will wait for the call (its episode was let go): if it is still running,
        it counts as stuck until it returns, as a call past its deadline does."""
        if isinstance(handle, Refused):
            return
        with self._lock:
            if handle.finished.is_set() or handle.abandoned:
                return
            stuck = self._abandon(handle)
        self._warn_if_full(stuck)

    def _abandon(self, handle: Handle) -> int:
        handle.abandoned = True
        self.stuck += 1
        return self.stuck

    def _warn_if_full(self, stuck: int) -> None:
        if stuck == self.max_stuck:
            log.error("environment: %d calls are still running past their deadlines "
                      "(%s %d): new calls are refused, each answered with an error, until "
                      "some return", stuck, self.field, self.max_stuck)

    @staticmethod
    def due(handle: Handle | Refused, timeout_s: float) -> bool:
        """Whether `wait(handle, timeout_s)` would return at once: the call returned, was
        refused, or is past its deadline."""
        return (isinstance(handle, Refused) or handle.finished.is_set()
                or time.monotonic() >= handle.started + timeout_s)

    def settle(self, handles: list[Handle | Refused], timeout_s: float, within_s: float,
               every: bool) -> None:
        """Until one of `handles` is due (`due`), or each of them with `every`, for
        `within_s` at most."""
        settled = all if every else any
        end = time.monotonic() + within_s
        while handles and not settled(self.due(h, timeout_s) for h in handles) \
                and time.monotonic() < end:
            time.sleep(POLL_S)

    def call_all(self, fns: list[Callable[[], Any]], timeout_s: float
                 ) -> list[Done | Overran | Refused]:
        """Every call of `fns` at once, each waited for up to `timeout_s` from its start."""
        handles = [self.start(fn) for fn in fns]
        return [self.wait(h, timeout_s) for h in handles]
