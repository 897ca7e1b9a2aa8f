"""The lease contract between rollout workers and the scheduler.

`scheduler_svc.core.SchedulerCore` implements it in process; `GrpcLeaseClient` implements it
over gRPC. Workers only see this interface, and one contract test runs against both.

Every call is safe to repeat when its reply was lost: a retried acquire sends the same
request id and gets the same leases; a repeated complete or release answers as the first
did and changes nothing; a repeated register from the same incarnation keeps its leases.
A worker's heartbeat names the leases it holds; the scheduler renews only those and
re-issues any other lease granted to it once that grant cannot still be on its way.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from relayrl.contracts.proto.v1 import scheduler_pb2, scheduler_pb2_grpc
from relayrl.runtime.deadlines import CONTROL_CALL_S
from relayrl.runtime.grpc_util import channel

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class LeasedPrompt:
    lease_id: str
    prompt_id: int
    text: str
    reference: str
    attempt: int
    partial_state: bytes = b""  # a PartialGroup to resume; empty for a fresh prompt
    kv_states: tuple[bytes, ...] = ()  # its sequences' KV states, when a repack moved it
    messages: tuple[Mapping[str, str], ...] = ()  # a chat prompt (text is then "")
    metadata: Mapping[str, Any] = field(default_factory=dict)  # for the reward


@dataclass(frozen=True)
class ProgressReply:
    accepted: bool  # False: the worker no longer holds the lease
    release: bool = False  # a repack moves the lease: hand it back now, with its state


@dataclass(frozen=True)
class LeaseBatch:
    leases: list[LeasedPrompt]
    done: bool  # no prompt will ever be handed out again
    retry_after_s: float  # set when nothing is available right now
    min_version: int = 0  # the oldest weights to start these prompts under


class LeaseClient(ABC):
    @abstractmethod
    def register(self, worker_id: str, address: str, incarnation: str = "") -> None:
        """`incarnation` names this process: registering again under it keeps its leases;
        a new one (or none) lapses those of an earlier process under this worker id."""

    @abstractmethod
    def acquire(self, worker_id: str, max_prompts: int, request_id: str = "") -> LeaseBatch:
        """New leases; with the `request_id` of this worker's last call, that call's leases
        (those still its own) again: a retry after a lost reply."""

    @abstractmethod
    def complete(self, worker_id: str, lease_id: str) -> bool:
        """True if the delivery counted (a repeated call answers True again, counted once);
        False if the lease had lapsed and was re-issued."""

    @abstractmethod
    def save_progress(self, worker_id: str, lease_id: str, state: bytes) -> ProgressReply:
        """Keep the lease's unfinished token state; says whether the worker still holds the
        lease, and whether a repack wants it handed back."""

    def save_progress_many(self, worker_id: str, saves: list[tuple[str, bytes]]
                           ) -> list[ProgressReply]:
        """save_progress for each (lease id, state), in order; a networked client sends them
        at once, so a worker's segment boundary costs one round trip, not one per group."""
        return [self.save_progress(worker_id, lease_id, state) for lease_id, state in saves]

    @abstractmethod
    def release(self, worker_id: str, lease_id: str, state: bytes = b"",
                kv_states: tuple[bytes, ...] = ()) -> bool:
        """Hand an unfinished lease back for re-issue now, with state to resume from, and
        optionally its sequences' KV states for the next holder."""

    @abstractmethod
    def heartbeat(self, worker_id: str, policy_version: int,
                  held: Collection[str] | None = None) -> bool:
        """Renews the leases in `held` (all of the worker's if None). False asks the worker
        to register again."""


class GrpcLeaseClient(LeaseClient):
    def __init__(self, address: str, timeout_s: float = CONTROL_CALL_S):
        self._channel = channel(address)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self.timeout_s = timeout_s

    def close(self) -> None:
        self._channel.close()

    def register(self, worker_id: str, address: str, incarnation: str = "") -> None:
        self._stub.Register(scheduler_pb2.RegisterRequest(
            worker_id=worker_id, address=address, incarnation=incarnation),
            timeout=self.timeout_s)

    def acquire(self, worker_id: str, max_prompts: int, request_id: str = "") -> LeaseBatch:
        resp = self._stub.AcquireLeases(
            scheduler_pb2.LeaseRequest(worker_id=worker_id, max_prompts=max_prompts,
                                       request_id=request_id),
            timeout=self.timeout_s)
        leases = [LeasedPrompt(lease.lease_id, lease.prompt.prompt_id, lease.prompt.text,
                               lease.prompt.reference, lease.attempt, lease.partial_state,
                               tuple(lease.kv_states),
                               tuple({"role": m.role, "content": m.content}
                                     for m in lease.prompt.messages),
                               _metadata(lease.prompt.metadata_json))
                  for lease in resp.leases]
        return LeaseBatch(leases, resp.done, resp.retry_after_s, resp.min_policy_version)

    def complete(self, worker_id: str, lease_id: str) -> bool:
        return self._stub.Complete(
            scheduler_pb2.CompleteRequest(worker_id=worker_id, lease_id=lease_id),
            timeout=self.timeout_s).accepted

    def save_progress(self, worker_id: str, lease_id: str, state: bytes) -> ProgressReply:
        resp = self._stub.SaveProgress(scheduler_pb2.SaveProgressRequest(
            worker_id=worker_id, lease_id=lease_id, state=state), timeout=self.timeout_s)
        return ProgressReply(resp.accepted, resp.release)

    def save_progress_many(self, worker_id: str, saves: list[tuple[str, bytes]]
                           ) -> list[ProgressReply]:
        futures = [self._stub.SaveProgress.future(scheduler_pb2.SaveProgressRequest(
            worker_id=worker_id, lease_id=lease_id, state=state), timeout=self.timeout_s)
            for lease_id, state in saves]
        return [ProgressReply(resp.accepted, resp.release)
                for resp in (f.result() for f in futures)]

    def release(self, worker_id: str, lease_id: str, state: bytes = b"",
                kv_states: tuple[bytes, ...] = ()) -> bool:
        return self._stub.Release(scheduler_pb2.ReleaseRequest(
            worker_id=worker_id, lease_id=lease_id, state=state, kv_states=kv_states),
            timeout=self.timeout_s).accepted

    def heartbeat(self, worker_id: str, policy_version: int,
                  held: Collection[str] | None = None) -> bool:
        request = scheduler_pb2.HeartbeatRequest(worker_id=worker_id,
                                                 policy_version=policy_version)
        if held is not None:
            request.held.SetInParent()  # an empty list says "none", unlike no list
            request.held.lease_ids.extend(held)
        return self._stub.Heartbeat(request, timeout=self.timeout_s).known


def _metadata(text: str) -> dict[str, Any]:
    """A lease's metadata_json: a JSON object, or {} when none was sent. One that is not
    an object is logged and read as {}: raising here would refuse the whole batch of
    leases on every retry; a reward that needs the metadata then fails that prompt's
    samples alone, each with its error (train/reward_errors)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as err:
        value = err
    if not isinstance(value, dict):
        log.error("Lease.prompt.metadata_json is not a JSON object (%s); the prompt's reward "
                  "gets no metadata", value if isinstance(value, ValueError)
                  else type(value).__name__)
        return {}
    return value
