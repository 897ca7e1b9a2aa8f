"""The repack half of the lease state machine (scheduler_svc.policy.LeasePolicy mixes it
in): which tail leases to recall, and which re-queued prompt a worker takes, since one
handed back by a repack waits for the worker chosen to continue it.

A lease can be recalled from a worker stuck on a few long sequences (relayrl.rules.repack's
rule); the worker hands it back with its token state at its next segment boundary, and the
prompt is reserved for the fuller worker chosen to continue it, for `reservation_s`.
"""

from __future__ import annotations

from relayrl.rules.repack import Move, plan_moves, repack_wanted


class RepackRules:
    """Methods only: the state (leases, workers, requeue, reserved, ...) is LeasePolicy's."""

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
