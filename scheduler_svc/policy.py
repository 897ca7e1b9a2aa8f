"""The scheduler's decisions as a pure state machine: no I/O, no clock of its own.

Every method takes `now`, so the live service and a simulator drive the same code.
A prompt is handed out by lease; a lease is renewed by its worker's heartbeats and, if it
lapses, the prompt goes back to the front of the queue until `max_attempts` leases have
failed, after which the prompt is reported failed. The number of prompts out at once
(handed out but not yet finished by the trainer) is capped, which bounds staleness.

Workers: a worker that (re)registers as a new process loses its predecessor's leases at
once. One that names the leases it holds in its heartbeats renews only those; a lease
granted to it but absent from them for `unheld_grace_s` (longer than its grant can take to
reach the worker) is re-issued, so a grant whose reply was lost for good does not stay out
forever. A draining worker gets no new leases.

Lost replies (scheduler_svc.idempotency): a retried acquire with the same request id gets
the leases the first call was granted, and a repeated complete, release or register
changes nothing.

Repacking: a lease can be recalled from a worker stuck on a few long sequences
(relayrl.rules.repack's rule); the worker hands it back with its token state at its next
segment boundary, and the prompt is reserved for the fuller worker chosen to continue it,
for `reservation_s`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from relayrl.rules.repack import Move, plan_moves, repack_wanted
from relayrl.rules.staleness import may_hand_out
from scheduler_svc.idempotency import COMPLETED, RELEASED, ReplyMemory
from scheduler_svc.lease_state import ActiveLease, Counters, Grant, WorkerState
from scheduler_svc.run_control import RunControl

__all__ = ["ActiveLease", "Counters", "Grant", "LeasePolicy", "WorkerState"]


@dataclass
class LeasePolicy:
    """The lease state, then the methods that change it in a lease's order: workers
    register, a lease is acquired, renewed by heartbeats, completed or handed back,
    expired, and repacked."""

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

    def register(self, worker_id: str, now: float, incarnation: str = "") -> None:
        """A worker (re)starts: leases an earlier process under its name held lapse now,
        since the new process knows nothing of them and its heartbeats would keep them.
        The same process registering again (its first reply lost) keeps them."""
        state = self.workers.get(worker_id)
        if state is not None and incarnation and state.incarnation == incarnation:
            state.last_seen = now
            return
        for lease in self.leases.values():
            if lease.worker_id == worker_id:
                lease.deadline = now
        self.expire(now)
        self.workers[worker_id] = WorkerState(last_seen=now, incarnation=incarnation)
        self.memory.forget_worker(worker_id)

    def drain(self, worker_id: str, lapse_leases: bool, now: float) -> None:
        """No new leases for the worker; its current ones finish, or lapse now (re-issued
        like expired ones) with `lapse_leases`."""
        if worker_id not in self.workers:
            raise KeyError(worker_id)
        self.draining.add(worker_id)
        if lapse_leases:
            for lease in self.leases.values():
                if lease.worker_id == worker_id:
                    lease.deadline = now
            self.expire(now)

    def undrain(self, worker_id: str) -> None:
        if worker_id not in self.workers:
            raise KeyError(worker_id)
        self.draining.discard(worker_id)

    def leases_by_worker(self) -> dict[str, int]:
        counts = dict.fromkeys(self.workers, 0)
        for lease in self.leases.values():
            counts[lease.worker_id] = counts.get(lease.worker_id, 0) + 1
        return counts

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

    def _next_queued(self, worker_id: str, now: float) -> int | None:
        """A re-queued prompt for this worker: one reserved for it first, else the first one
        not reserved for another worker that can still take it."""
        pick = None
        for prompt_id in self.requeue:
            to, until = self.reserved.get(prompt_id, ("", 0.0))
            if to == worker_id:
                pick = prompt_id
                break
            if pick is None and (not to or until <= now or to not in self.workers
                                 or to in self.draining):
                pick = prompt_id
        if pick is None:
            return None
        self.requeue.remove(pick)
        if self.reserved.pop(pick, ("", 0.0))[0] == worker_id:
            self.counters.leases_moved += 1
        return pick

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

    def heartbeat(self, worker_id: str, policy_version: int, now: float,
                  held: Collection[str] | None = None) -> bool:
        """Renews the worker's leases, only those in `held` when it names them. False means
        the worker is unknown and must register."""
        state = self.workers.get(worker_id)
        if state is None:
            return False
        state.last_seen = now
        state.policy_version = policy_version
        for lease in self.leases.values():
            if lease.worker_id == worker_id and (held is None or lease.lease_id in held):
                lease.deadline = now + self.lease_ttl_s
        return True

    def release_unheld(self, worker_id: str, held: Collection[str], now: float
                       ) -> list[ActiveLease]:
        """Re-issue the worker's leases absent from `held`, the leases its heartbeat says
        it holds, once granted unheld_grace_s ago: the grant's reply never reached it, or it
        let the lease go unheard. A later grant may still be on its way to it. The hand-back
        costs no attempt, and a late delivery still counts while the prompt waits."""
        gone = [lease for lease in self.leases.values()
                if lease.worker_id == worker_id and lease.lease_id not in held
                and now - lease.granted_at >= self.unheld_grace_s]
        for lease in gone:
            self._hand_back(lease, now)
            self.expired[lease.lease_id] = lease.prompt_id
            self.counters.leases_unheld += 1
        return gone

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

    def note_progress(self, lease_id: str, worker_id: str, unfinished: int) -> bool | None:
        """The holder saved the lease's token state with `unfinished` sequences left. Returns
        None if it does not hold the lease, else whether a repack recalled it."""
        lease = self.leases.get(lease_id)
        if lease is None or lease.worker_id != worker_id:
            return None
        lease.unfinished = unfinished
        return bool(lease.recall_to)

    def plan_repack(self, now: float, force: bool = False) -> list[Move]:
        """Recall the leases of workers left with a tail, for the fullest workers with room.
        Unless forced, only when no prompt waits to be handed out (idle room is then filled
        by new prompts instead). Workers with a move under way sit this round out."""
        if not self.worker_capacity:
            return []
        if not force and not repack_wanted(len(self.requeue), self._may_hand_out_new()):
            return []
        self.expire(now)
        busy = {lease.worker_id for lease in self.leases.values() if lease.recall_to}
        busy |= {lease.recall_to for lease in self.leases.values() if lease.recall_to}
        holdings: dict[str, list[tuple[str, int]]] = {
            w: [] for w in self.workers if w not in busy}
        for lease in self.leases.values():
            if lease.worker_id in holdings:
                holdings[lease.worker_id].append(
                    (lease.lease_id,
                     self.group_size if lease.unfinished < 0 else lease.unfinished))
        alive = [w for w, state in self.workers.items()
                 if w in holdings and w not in self.draining
                 and now - state.last_seen < self.lease_ttl_s]
        moves = plan_moves(holdings, self.worker_capacity, self.repack_below, alive)
        for move in moves:
            self.leases[move.item].recall_to = move.target
        self.counters.leases_recalled += len(moves)
        return moves
