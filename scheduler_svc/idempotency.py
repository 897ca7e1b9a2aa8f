"""What the lease state machine remembers so that a retried call, whose first reply was lost,
is answered as the first one was and changes nothing.

A worker that sees no reply cannot know whether its call was carried out; it sends the
same call again. For AcquireLeases it sends the same request id, and gets the leases that
id was granted (not new ones, which nobody would then hold). A repeated Complete or Release
of a lease finds the lease gone: its outcome, kept here for the most recent leases, tells a
retry from a stale call of a lapsed lease.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

COMPLETED, RELEASED = "completed", "released"
# Leases whose outcome is remembered: a retry follows its call within a few call deadlines,
# while far fewer than this many leases end meanwhile.
RECENT_OUTCOMES = 4096
MAX_ID_CHARS = 128  # request ids, incarnations and lease ids a worker sends
ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


def check_id(value: str, where: str, empty_ok: bool = True) -> str:
    """A client-chosen id: at most MAX_ID_CHARS of ID_CHARS. ValueError names the field."""
    if not value and not empty_ok:
        raise ValueError(f"{where} is empty")
    if len(value) > MAX_ID_CHARS:
        raise ValueError(f"{where}: {len(value)} characters, more than {MAX_ID_CHARS}")
    bad = set(value) - ID_CHARS
    if bad:
        raise ValueError(f"{where} {value[:MAX_ID_CHARS]!r}: characters {sorted(bad)} not "
                         "allowed (A-Z a-z 0-9 . _ : -)")
    return value


@dataclass
class ReplyMemory:
    # worker -> (its last AcquireLeases request id, the lease ids it was granted)
    last_acquire: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    # lease id -> (worker, COMPLETED or RELEASED), oldest first
    outcomes: OrderedDict[str, tuple[str, str]] = field(default_factory=OrderedDict)
    limit: int = RECENT_OUTCOMES

    def granted(self, worker_id: str, request_id: str) -> tuple[str, ...] | None:
        """The lease ids granted to this worker's last call, if `request_id` names it."""
        last = self.last_acquire.get(worker_id)
        if not request_id or last is None or last[0] != request_id:
            return None
        return last[1]

    def note_grant(self, worker_id: str, request_id: str, lease_ids: list[str]) -> None:
        if request_id:
            self.last_acquire[worker_id] = (request_id, tuple(lease_ids))

    def forget_worker(self, worker_id: str) -> None:
        self.last_acquire.pop(worker_id, None)

    def note_outcome(self, lease_id: str, worker_id: str, outcome: str) -> None:
        self.outcomes[lease_id] = (worker_id, outcome)
        self.outcomes.move_to_end(lease_id)
        while len(self.outcomes) > self.limit:
            self.outcomes.popitem(last=False)

    def ended(self, lease_id: str, worker_id: str, outcome: str) -> bool:
        """Whether this worker's lease already ended so: a repeated call."""
        return self.outcomes.get(lease_id) == (worker_id, outcome)
