"""A rollout worker's side of the lease contract, safe when a reply is lost.

A scheduler call that fails may have been carried out all the same (its reply was dropped or
came after the deadline), so every call here is one that is safe to make again:

- a lease request keeps its request id until a reply arrives, so the retry is answered with
  the leases the first call was granted rather than new ones nobody would hold;
- a delivered lease's Complete is asked again (at each turn of the worker's loop) until it
  is answered; a repeated Complete counts once, and the lease stays held, renewed by the
  heartbeats, meanwhile;
- a Release is sent again once at once; a lease that still could not be handed back is let
  go all the same, and the scheduler re-issues it once the heartbeats stop naming it.

The heartbeats name the leases held here, which is what lets the scheduler tell a lease
this worker holds from a grant whose reply never reached it.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable

import grpc

from relayrl.contracts.leases import LeaseBatch, LeaseClient, ProgressReply

log = logging.getLogger(__name__)
TRIES = 2  # a Complete or Release whose reply was lost is sent again at once


class WorkerLeases:
    def __init__(self, client: LeaseClient, worker_id: str,
                 on_failure: Callable[[], None] = lambda: None):
        self.client = client
        self.worker_id = worker_id
        self.on_failure = on_failure  # each failed call, for the worker's figures
        self.incarnation = uuid.uuid4().hex  # this process, to the scheduler
        self._held: set[str] = set()
        self._lock = threading.Lock()  # the heartbeat thread reads what the loop changes
        self._acquire_id = ""  # of the lease request whose reply has not come
        self._unconfirmed: list[str] = []  # delivered leases whose Complete was not answered

    def held(self) -> set[str]:
        with self._lock:
            return set(self._held)

    def let_go(self, lease_ids: Iterable[str]) -> None:
        with self._lock:
            self._held.difference_update(lease_ids)

    def register(self, address: str) -> None:
        self.client.register(self.worker_id, address, self.incarnation)

    def heartbeat(self, policy_version: int) -> bool:
        return self.client.heartbeat(self.worker_id, policy_version, self.held())

    def acquire(self, max_prompts: int) -> LeaseBatch:
        """New leases, held from here on; RpcError if no reply came (the next call asks
        again for the same ones)."""
        self._acquire_id = self._acquire_id or uuid.uuid4().hex
        batch = self.client.acquire(self.worker_id, max_prompts, self._acquire_id)
        self._acquire_id = ""
        with self._lock:
            self._held.update(lp.lease_id for lp in batch.leases)
        return batch

    def save_progress(self, saves: list[tuple[str, bytes]]) -> list[ProgressReply]:
        """Save each (lease id, token state) in one round trip; RpcError if no reply came
        (sent once: the next boundary saves again)."""
        try:
            return self.client.save_progress_many(self.worker_id, saves)
        except grpc.RpcError:
            self.on_failure()
            raise

    def _retried(self, call, *args):
        for attempt in range(TRIES):
            try:
                return call(self.worker_id, *args)
            except grpc.RpcError:
                self.on_failure()
                if attempt + 1 == TRIES:
                    raise

    def delivered(self, lease_id: str) -> None:
        """The lease's group is in the buffer: complete it at the next confirm_deliveries
        (the segment's other groups go to the buffer first, so a batch is not held up by a
        Complete round trip per group)."""
        self._unconfirmed.append(lease_id)

    def confirm_deliveries(self) -> None:
        while self._unconfirmed:
            lease_id = self._unconfirmed[0]
            try:
                accepted = self._retried(self.client.complete, lease_id)
            except grpc.RpcError as err:
                log.warning("completing lease %s failed (%s); asking again later", lease_id,
                            err.code())
                return
            self._unconfirmed.pop(0)
            self.let_go([lease_id])
            if not accepted:
                log.info("lease %s had lapsed before its delivery, and was re-issued; the "
                         "buffer keeps one of its groups", lease_id)

    def hand_back(self, lease_id: str, state: bytes = b"") -> bool:
        """Release the lease, with `state` to resume from; True if the scheduler answered.
        Either way it is no longer held here."""
        self.let_go([lease_id])
        try:
            self._retried(self.client.release, lease_id, state)
        except grpc.RpcError as err:
            log.warning("could not hand back lease %s (%s); it is re-issued without its state",
                        lease_id, err.code())
            return False
        return True

    def hand_over(self, lease_id: str, kv_states: tuple[bytes, ...]) -> bool:
        """Release a lease a repack recalled; False (still held) if the scheduler refused or
        did not answer: the next save's reply says whether it is still this worker's."""
        try:
            accepted = self._retried(self.client.release, lease_id, b"", kv_states)
        except grpc.RpcError as err:
            log.warning("handing lease %s over failed (%s)", lease_id, err.code())
            return False
        if accepted:
            self.let_go([lease_id])
        return accepted
