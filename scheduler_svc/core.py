"""The scheduler in process: LeasePolicy behind a lock, the task's prompts, a Redis ledger.

The gRPC servicer is a thin translation of this class, which is also the in-process
implementation of the lease contract.
"""

from __future__ import annotations

import logging
import threading
import time

from relayrl.config import RunConfig
from relayrl.keys import RunKeys
from relayrl.leases import LeaseBatch, LeaseClient, LeasedPrompt
from relayrl.tasks import make_task
from scheduler_svc.policy import LeasePolicy

log = logging.getLogger(__name__)


class SchedulerCore(LeaseClient):
    def __init__(self, cfg: RunConfig, redis, clock=time.monotonic):
        self.cfg = cfg
        self.policy = LeasePolicy(lease_ttl_s=cfg.scheduler.lease_ttl_s,
                                  max_attempts=cfg.scheduler.max_attempts,
                                  max_inflight=cfg.inflight_limit,
                                  max_prompts=cfg.scheduler.max_prompts,
                                  start_after_workers=cfg.scheduler.start_after_workers)
        self.redis = redis
        self.keys = RunKeys(cfg.run_id)
        self.task = make_task(cfg.task)
        self.clock = clock
        self.lock = threading.Lock()

    def refresh(self) -> None:
        """Expire lapsed leases and learn how far the trainer has got: each of its steps
        takes one batch of `groups_per_batch` prompts (trained or dropped as stale)."""
        trainer_step = int(self.redis.get(self.keys.trainer_version) or 0)
        with self.lock:
            self.policy.set_finished(trainer_step * self.cfg.buffer.groups_per_batch)
            failed_before = set(self.policy.failed)
            lapsed = self.policy.expire(self.clock())
            newly_failed = self.policy.failed - failed_before
        for lease in lapsed:
            log.warning("lease %s of prompt %d on %s expired (attempt %d)", lease.lease_id,
                        lease.prompt_id, lease.worker_id, lease.attempt)
        if newly_failed:
            self.redis.sadd(self.keys.ledger("failed"), *sorted(newly_failed))

    def register(self, worker_id: str, address: str) -> None:
        if not worker_id:
            raise ValueError("Register: worker_id is empty")
        with self.lock:
            self.policy.register(worker_id, self.clock())
        log.info("worker %s registered (%s)", worker_id, address)

    def acquire(self, worker_id: str, max_prompts: int) -> LeaseBatch:
        if not worker_id:
            raise ValueError("AcquireLeases: worker_id is empty")
        if not 1 <= max_prompts <= 1024:
            raise ValueError(f"AcquireLeases: max_prompts must be in 1..1024, got {max_prompts}")
        with self.lock:
            first_new = self.policy.cursor
            grants = self.policy.acquire(worker_id, max_prompts, self.clock())
            new_ids = list(range(first_new, self.policy.cursor))
            done = self.policy.done
        if new_ids:
            self.redis.sadd(self.keys.ledger("leased"), *new_ids)
        leases = []
        for g in grants:
            p = self.task.problem(g.prompt_id)
            leases.append(LeasedPrompt(g.lease_id, p.prompt_id, p.text, p.reference, g.attempt))
        return LeaseBatch(leases, done, 0.0 if leases else 0.05)

    def complete(self, worker_id: str, lease_id: str) -> bool:
        with self.lock:
            return self.policy.complete(lease_id, worker_id)

    def heartbeat(self, worker_id: str, policy_version: int) -> bool:
        with self.lock:
            return self.policy.heartbeat(worker_id, policy_version, self.clock())
