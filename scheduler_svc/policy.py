"""The scheduler's decisions as a pure state machine: no I/O, no clock of its own.

Every method takes `now`, so the live service and a simulator drive the same code.
A prompt is handed out by lease; a lease is renewed by its worker's heartbeats and, if it
lapses, the prompt goes back to the front of the queue until `max_attempts` leases have
failed, after which the prompt is reported failed. The number of prompts out at once
(handed out but not yet finished by the trainer) is capped, which bounds staleness.

Repacking (scheduler_svc.repack_rules): a lease can be recalled from a worker left with a
tail, for a fuller worker to continue it.

Lost replies (scheduler_svc.idempotency): a retried acquire with the same request id gets
the leases the first call was granted, and a repeated complete, release or register
changes nothing.

Workers (scheduler_svc.worker_rules): registering, draining, and heartbeats, which renew
a worker's leases and re-issue a grant it never received.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from relayrl.rules.staleness import may_hand_out
from scheduler_svc.idempotency import COMPLETED, RELEASED, ReplyMemory
from scheduler_svc.lease_state import ActiveLease, Counters, Grant, WorkerState
from scheduler_svc.repack_rules import RepackRules
from scheduler_svc.run_control import RunControl
from scheduler_svc.worker_rules import WorkerRules

__all__ = ["ActiveLease", "Counters", "Grant", "LeasePolicy", "WorkerState"]


@dataclass
class LeasePolicy(WorkerRules, RepackRules):
    lease_ttl_s: float
    max_attempts: int
    max_inflight: int
    max_prompts: int = 0  # 0 = unlimited
    start_after_workers: int = 0  # a gate that opens once, when this many have registered
    group_size: int = 1  # sequences per prompt
    worker_capacity: int = 0  # sequences a worker runs at once; 0 turns repacking off
    repack_below: float = 0.25  # a worker holding at most this share of capacity is a tail
    reservation_s: float = 5.0  # how long a handed-back prompt waits for the chosen worker
    unheld_grace_s: float = 20.0  # longer than a grant's reply can take to reach its worker
    started: bool = False
    cursor: int = 0  # next never-handed-out prompt id
    finished: int = 0  # prompts the trainer has stepped past (trained or dropped as stale)
    requeue: deque[int] = field(default_factory=deque)
    attempts: dict[int, int] = field(default_factory=dict)
    leases: dict[str, ActiveLease] = field(default_factory=dict)
    # Per-prompt state lives only while a prompt may be leased again (attempts) or a lapsed
    # lease may still deliver (expired): a run hands out prompts without end.
    expired: dict[str, int] = field(default_factory=dict)  # lease id -> prompt id
    failed: set[int] = field(default_factory=set)
    workers: dict[str, WorkerState] = field(default_factory=dict)
    draining: set[str] = field(default_factory=set)  # workers that get no new leases
    reserved: dict[int, tuple[str, float]] = field(default_factory=dict)  # prompt -> (to, until)
    counters: Counters = field(default_factory=Counters)
    control: RunControl = field(default_factory=RunControl)  # pause, resume, stop
    memory: ReplyMemory = field(default_factory=ReplyMemory)  # to answer retries
    lease_prefix: str = "L"  # the live service makes it unique per process
    _next_lease: int = 0

    @property
    def handed_out(self) -> int:
        return self.cursor

    @property
    def inflight(self) -> int:
        return self.cursor - self.finished - len(self.failed)

    @property
    def done(self) -> bool:
        capped = self.max_prompts > 0 and self.cursor >= self.max_prompts
        return ((capped or self.control.stopping) and not self.requeue and not self.leases)

    def restore(self, leased: set[int], settled: set[int], failed: set[int]) -> None:
        """Take up from a previous scheduler's ledger: every prompt below the highest one it
        leased was handed out; those neither settled (assembled into a batch) nor failed go
        back to the queue, since their leases died with it. One whose group had already
        reached the buffer is generated again, and the buffer drops the second group."""
        if not leased:
            return
        self.cursor = max(self.cursor, max(leased) + 1)
        self.failed |= failed
        self.started = True
        self.requeue.extend(p for p in range(self.cursor)
                            if p not in settled and p not in self.failed)

    def set_finished(self, finished: int) -> None:
        self.finished = max(self.finished, finished)

    def acquire(self, worker_id: str, max_prompts: int, now: float,
                request_id: str = "") -> list[Grant]:
        """Up to `max_prompts` new leases; the same ones again for a repeated `request_id`."""
        if max_prompts < 1:
            raise ValueError(f"max_prompts must be >= 1, got {max_prompts}")
        self.expire(now)
        if worker_id not in self.workers:
            self.register(worker_id, now)
        self.workers[worker_id].last_seen = now
        again = self._grant_again(worker_id, request_id, now)
        if again:
            return again
        grants = self._grant(worker_id, max_prompts, now)
        self.memory.note_grant(worker_id, request_id, [g.lease_id for g in grants])
        return grants

    def _grant_again(self, worker_id: str, request_id: str, now: float) -> list[Grant]:
        """A retry of the worker's last call: the leases it was granted that the worker may
        still take up, renewed, since this reply is on its way now. None left (or none
        granted) grants anew: a call answered with nothing can be made again."""
        grants = []
        for lease_id in self.memory.granted(worker_id, request_id) or ():
            lease = self.leases.get(lease_id)
            if lease is not None and lease.worker_id == worker_id:
                lease.granted_at, lease.deadline = now, now + self.lease_ttl_s
                grants.append(Grant(lease.lease_id, lease.prompt_id, lease.attempt))
        return grants

    def _grant(self, worker_id: str, max_prompts: int, now: float) -> list[Grant]:
        if worker_id in self.draining or not self.control.leases_allowed:
            return []
        if not self.started:
            if len(self.workers) < self.start_after_workers:
                return []
            self.started = True
        grants = []
        while len(grants) < max_prompts:
            prompt_id = self._next_queued(worker_id, now)
            if prompt_id is None:
                if not self._may_hand_out_new():
                    break
                prompt_id = self.cursor
                self.cursor += 1
            grants.append(self._lease(prompt_id, worker_id, now))
        return grants

    def _may_hand_out_new(self) -> bool:
        if not self.control.new_prompts_allowed:
            return False
        if self.max_prompts and self.cursor >= self.max_prompts:
            return False
        return may_hand_out(self.inflight, self.max_inflight)

    def _lease(self, prompt_id: int, worker_id: str, now: float) -> Grant:
        self._next_lease += 1
        lease_id = f"{self.lease_prefix}{self._next_lease}"
        attempt = self.attempts.get(prompt_id, 0) + 1
        self.attempts[prompt_id] = attempt
        self.leases[lease_id] = ActiveLease(lease_id, prompt_id, worker_id, attempt,
                                            now + self.lease_ttl_s, granted_at=now)
        self.counters.leases_granted += 1
        return Grant(lease_id, prompt_id, attempt)

    def complete(self, lease_id: str, worker_id: str) -> bool:
        """The worker delivered every sample of the lease to the buffer. Its repeated call
        (the first reply lost) is accepted again and counted once."""
        lease = self.leases.get(lease_id)
        if lease is not None and lease.worker_id == worker_id:
            del self.leases[lease_id]
            prompt_id = lease.prompt_id
        elif self.memory.ended(lease_id, worker_id, COMPLETED):
            return True
        else:  # a late delivery still counts if its prompt is waiting to be leased again
            prompt_id = self.expired.pop(lease_id, None)
            if prompt_id is None or prompt_id not in self.requeue:
                return False
            self.requeue.remove(prompt_id)
        self._settled(prompt_id)
        self.counters.leases_completed += 1
        self.memory.note_outcome(lease_id, worker_id, COMPLETED)
        return True

    def _settled(self, prompt_id: int) -> None:
        """The prompt's group reached the buffer (or it failed): it is never leased again, so
        its attempt count and any lapsed lease of it can go."""
        self.attempts.pop(prompt_id, None)
        self.reserved.pop(prompt_id, None)
        if self.expired:
            self.expired = {lease: p for lease, p in self.expired.items() if p != prompt_id}

    def holder_prompt(self, lease_id: str, worker_id: str) -> int | None:
        """The prompt of a lease the worker still holds, else None."""
        lease = self.leases.get(lease_id)
        if lease is None or lease.worker_id != worker_id:
            return None
        return lease.prompt_id

    def released_before(self, lease_id: str, worker_id: str) -> bool:
        """Whether the worker already handed this lease back: its Release is a retry."""
        return self.memory.ended(lease_id, worker_id, RELEASED)

    def release(self, lease_id: str, worker_id: str, now: float) -> bool:
        """The worker hands an unfinished lease back: its prompt goes to the front of the
        queue at once (reserved for the worker a repack chose, if it was recalled), and the
        hand-back does not count as a failed attempt. A repeated call changes nothing."""
        if self.released_before(lease_id, worker_id):
            return True
        if self.holder_prompt(lease_id, worker_id) is None:
            return False
        self._hand_back(self.leases[lease_id], now)
        self.counters.leases_released += 1
        self.memory.note_outcome(lease_id, worker_id, RELEASED)
        return True

    def _hand_back(self, lease: ActiveLease, now: float) -> None:
        del self.leases[lease.lease_id]
        self.attempts[lease.prompt_id] = lease.attempt - 1
        self.requeue.appendleft(lease.prompt_id)
        if lease.recall_to:
            self.reserved[lease.prompt_id] = (lease.recall_to, now + self.reservation_s)

    def expire(self, now: float) -> list[ActiveLease]:
        lapsed = [lease for lease in self.leases.values() if lease.deadline <= now]
        for lease in lapsed:
            del self.leases[lease.lease_id]
            self.counters.leases_expired += 1
            if lease.attempt >= self.max_attempts:
                self.failed.add(lease.prompt_id)
                self._settled(lease.prompt_id)
            else:
                self.expired[lease.lease_id] = lease.prompt_id
                self.requeue.appendleft(lease.prompt_id)
        return lapsed
