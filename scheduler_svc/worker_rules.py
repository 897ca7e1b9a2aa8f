"""The workers half of the lease state machine (scheduler_svc.policy.LeasePolicy mixes it
in): who is there, who is draining, and what a heartbeat renews.

A worker that (re)registers as a new process loses its predecessor's leases at once. One
that names the leases it holds in its heartbeats renews only those; a lease granted to it
but absent from them for `unheld_grace_s` (longer than its grant can take to reach the
worker) is re-issued, so a grant whose reply was lost for good does not stay out forever.
Exercised by tests/unit/test_policy.py.
"""

from __future__ import annotations

from collections.abc import Collection

from scheduler_svc.lease_state import ActiveLease, WorkerState


class WorkerRules:
    """Methods only: the state (workers, leases, draining, memory, ...) is LeasePolicy's."""

    def leases_by_worker(self) -> dict[str, int]:
        counts = dict.fromkeys(self.workers, 0)
        for lease in self.leases.values():
            counts[lease.worker_id] = counts.get(lease.worker_id, 0) + 1
        return counts

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
