"""The records of the lease state machine (scheduler_svc.policy): a lease out, a grant
as the worker sees it, a worker, and the counters the service exports."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ActiveLease:
    lease_id: str
    prompt_id: int
    worker_id: str
    attempt: int
    deadline: float
    unfinished: int = -1  # sequences still generating, as last reported; -1: not yet
    recall_to: str = ""  # a repack chose this worker to continue it; the holder hands it back
    granted_at: float = 0.0  # when granted, or granted again to a retry: its reply may be out


@dataclass(frozen=True)
class Grant:
    lease_id: str
    prompt_id: int
    attempt: int


@dataclass
class WorkerState:
    last_seen: float
    policy_version: int = 0
    incarnation: str = ""  # the process that registered last, if it said


@dataclass
class Counters:
    leases_granted: int = 0
    leases_completed: int = 0
    leases_expired: int = 0
    leases_released: int = 0
    leases_recalled: int = 0
    leases_moved: int = 0  # recalled, handed back, and taken by the chosen worker
    leases_unheld: int = 0  # granted, then absent from the worker's heartbeats: re-issued
