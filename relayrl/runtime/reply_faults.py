"""Lost and late replies, for chaos tests: a gRPC servicer whose calls are carried out but
whose replies a seeded schedule drops (the caller sees UNAVAILABLE) or holds past the
caller's deadline (the caller sees DEADLINE_EXCEEDED), as a network failing after the work
was done would. Every caller must then be safe to retry: tests/chaos/test_lost_replies.py.

Process faults (kill -9, restart) are relayrl_testkit.fault_schedule and
relayrl_testkit.fault_injector; this is the other half of fault injection: a peer that did the
work and whose answer never came.

Only the environment variable RELAYRL_TEST_LOST_REPLIES turns it on, never a config file,
so no deployment's settings can carry it by accident; a service started with it logs a
warning. Its value is "seed,drop,late", e.g. "7,0.1,0.05": the schedule's seed and the
shares of replies dropped and held late. Each method of each service draws its own
seeded stream, so the nth call of a method meets the same fault in every run of a seed.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc

log = logging.getLogger(__name__)
ENV = "RELAYRL_TEST_LOST_REPLIES"
MAX_SHARE = 0.5  # of replies lost: beyond it a run does little but retry
LATE_MARGIN_S = 0.2  # a late reply is held this long past the caller's deadline
MAX_LATE_S = 60.0  # a call with a later deadline (or none) has its reply dropped instead
DROP, LATE = "drop", "late"


@dataclass(frozen=True)
class ReplyFaults:
    seed: int
    drop: float  # share of replies dropped after the call was carried out
    late: float  # share held past the caller's deadline

    @classmethod
    def parse(cls, text: str) -> ReplyFaults:
        parts = text.split(",")
        try:
            if len(parts) != 3:
                raise ValueError
            faults = cls(int(parts[0]), float(parts[1]), float(parts[2]))
        except ValueError:
            raise ValueError(f"{ENV}={text!r}: expected 'seed,drop,late', e.g. '7,0.1,0.05'"
                             ) from None
        for name, share in (("drop", faults.drop), ("late", faults.late)):
            if not (math.isfinite(share) and 0.0 <= share <= MAX_SHARE):
                raise ValueError(f"{ENV}: {name} share {share} is outside [0, {MAX_SHARE}]")
        return faults

    @classmethod
    def from_env(cls) -> ReplyFaults | None:
        text = os.environ.get(ENV, "")
        return cls.parse(text) if text else None


class FaultSchedule:
    """The fault each call of each method meets: "" (none), DROP or LATE."""

    def __init__(self, faults: ReplyFaults, service: str):
        self.faults = faults
        self.service = service
        self._rngs: dict[str, random.Random] = {}
        self._calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def next(self, method: str) -> tuple[str, int]:
        """The fault of this method's next call, and the call's number (from 1)."""
        with self._lock:
            rng = self._rngs.setdefault(
                method, random.Random(f"{self.faults.seed}:{self.service}.{method}"))
            n = self._calls[method] = self._calls.get(method, 0) + 1
            x = rng.random()
        if x < self.faults.drop:
            return DROP, n
        if x < self.faults.drop + self.faults.late:
            return LATE, n
        return "", n


class _LosingServicer:
    """The servicer with its named unary methods' replies lost on schedule; every other
    attribute is the servicer's own."""

    def __init__(self, inner, schedule: FaultSchedule, methods: Iterable[str]):
        self._inner = inner
        for name in methods:
            setattr(self, name, self._losing(name, getattr(inner, name), schedule))

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    @staticmethod
    def _losing(name: str, method: Callable, schedule: FaultSchedule) -> Callable:
        where = f"{schedule.service}.{name}"

        def call(request, context):
            reply = method(request, context)  # carried out first: only the answer is lost
            fault, n = schedule.next(name)
            remaining = context.time_remaining()
            if fault == LATE and remaining is not None and remaining < MAX_LATE_S:
                log.warning("lost reply: %s call %d answered after its deadline", where, n)
                time.sleep(remaining + LATE_MARGIN_S)
            elif fault:
                log.warning("lost reply: %s call %d dropped", where, n)
                context.abort(grpc.StatusCode.UNAVAILABLE,
                              f"{where}: reply dropped by the fault schedule of ${ENV}")
            return reply

        return call


def with_lost_replies(servicer, service: str, methods: Iterable[str],
                      faults: ReplyFaults | None = None):
    """`servicer` itself unless faults are given or RELAYRL_TEST_LOST_REPLIES is set; then
    a stand-in whose `methods` (unary ones) lose replies as the schedule says."""
    faults = faults if faults is not None else ReplyFaults.from_env()
    if faults is None:
        return servicer
    methods = tuple(methods)
    log.warning("%s loses replies of %s on purpose (seed %d, %.0f%% dropped, %.0f%% late): "
                "a chaos test setting (%s), never for a real run", service, ", ".join(methods),
                faults.seed, 100 * faults.drop, 100 * faults.late, ENV)
    return _LosingServicer(servicer, FaultSchedule(faults, service), methods)
