"""The launcher's restart policy: a service process that dies is started again after a
backoff that doubles with each restart, at most a bounded number of times per service.

Every service keeps what matters in Redis or on disk (leases and the ledger, stream
positions, checkpoints), so a restarted process takes up where the dead one left off; the
backoff keeps a service that dies at once on start-up from spinning."""

from __future__ import annotations

from dataclasses import dataclass

from relayrl.config.restarts import RestartConfig


@dataclass
class RestartBudget:
    """How many more times a service may be restarted, and when the next restart is due."""
    limit: int
    backoff_s: float
    backoff_max_s: float
    used: int = 0
    due_at: float | None = None  # a restart is booked for this time (monotonic clock)

    @classmethod
    def of(cls, cfg: RestartConfig, limit: int | None = None) -> RestartBudget:
        """A fresh budget from the run's `restarts` settings (`limit` overrides its count)."""
        return cls(cfg.max_restarts if limit is None else limit, cfg.backoff_s,
                   cfg.backoff_max_s)

    @property
    def pending(self) -> bool:
        """True while a restart is booked."""
        return self.due_at is not None

    def book(self, now: float) -> bool:
        """A death: book a restart, or False when the budget is spent."""
        if self.used >= self.limit:
            return False
        self.due_at = now + min(self.backoff_max_s, self.backoff_s * 2 ** self.used)
        self.used += 1
        return True

    def take(self, now: float) -> bool:
        """True once, when the booked restart is due."""
        if self.due_at is None or now < self.due_at:
            return False
        self.due_at = None
        return True
