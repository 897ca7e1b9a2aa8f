"""Where a rollout worker's training loop spends its time, and the log line that says so.

The loop's parts (generate, weights, lease, deliver, save, idle) are timed into one counter,
exported as rollout/loop_s (rollout_svc.telemetry) and logged now and then together with how
full the engine calls were: the first thing to read when a worker generates slower than
expected. Exercised through the worker by tests/integration/test_metrics_endpoints.py.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from contextlib import contextmanager

log = logging.getLogger(__name__)


class LoopClock:
    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self._last_report = time.monotonic()

    @contextmanager
    def timed(self, part: str):
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.seconds[part] += time.monotonic() - t0

    def report(self, segments: int, sequences_decoded: int, seats: int,
               every_s: float = 60.0) -> None:
        """A log line when `every_s` has passed since the last: each part's share of the
        loop's time, and the sequences per engine call against the seats."""
        now = time.monotonic()
        if now - self._last_report < every_s:
            return
        self._last_report = now
        total = sum(self.seconds.values()) or 1.0
        shares = ", ".join(f"{part} {s / total:.0%}" for part, s in self.seconds.most_common())
        fill = sequences_decoded / segments if segments else 0.0
        log.info("loop: %s; %d engine calls, %.1f of %d seats each", shares, segments, fill,
                 seats)
