"""The Scheduler gRPC service: LeasePolicy behind a lock, with a ledger in Redis."""

from __future__ import annotations

import logging
import threading
import time

import grpc

from relayrl.config import RunConfig
from relayrl.keys import RunKeys
from relayrl.logs import setup_logging
from relayrl.proto.v1 import scheduler_pb2, scheduler_pb2_grpc
from relayrl.redis_conn import open_redis
from relayrl.service import ServiceRunner
from relayrl.tasks import make_task
from scheduler_svc.policy import LeasePolicy

log = logging.getLogger(__name__)


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, cfg: RunConfig, policy: LeasePolicy, redis, clock=time.monotonic):
        self.cfg = cfg
        self.policy = policy
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

    def Register(self, request, context):
        if not request.worker_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Register: worker_id is empty")
        with self.lock:
            self.policy.register(request.worker_id, self.clock())
        log.info("worker %s registered (%s)", request.worker_id, request.address)
        return scheduler_pb2.RegisterResponse(
            run_id=self.cfg.run_id, lease_ttl_s=self.cfg.scheduler.lease_ttl_s,
            heartbeat_interval_s=self.cfg.scheduler.heartbeat_interval_s)

    def AcquireLeases(self, request, context):
        if not request.worker_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "AcquireLeases: worker_id is empty")
        if not 1 <= request.max_prompts <= 1024:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "AcquireLeases: max_prompts must be in 1..1024, "
                          f"got {request.max_prompts}")
        with self.lock:
            first_new = self.policy.cursor
            grants = self.policy.acquire(request.worker_id, request.max_prompts, self.clock())
            new_ids = list(range(first_new, self.policy.cursor))
            done = self.policy.done
        if new_ids:
            self.redis.sadd(self.keys.ledger("leased"), *new_ids)
        leases = []
        for g in grants:
            p = self.task.problem(g.prompt_id)
            leases.append(scheduler_pb2.Lease(
                lease_id=g.lease_id, attempt=g.attempt, ttl_s=self.cfg.scheduler.lease_ttl_s,
                prompt=scheduler_pb2.Prompt(prompt_id=p.prompt_id, text=p.text,
                                            reference=p.reference)))
        return scheduler_pb2.LeaseResponse(leases=leases, done=done,
                                           retry_after_s=0.0 if leases else 0.05)

    def Complete(self, request, context):
        with self.lock:
            accepted = self.policy.complete(request.lease_id, request.worker_id)
        return scheduler_pb2.CompleteResponse(accepted=accepted)

    def Heartbeat(self, request, context):
        with self.lock:
            known = self.policy.heartbeat(request.worker_id, request.policy_version, self.clock())
        return scheduler_pb2.HeartbeatResponse(known=known)

    def Status(self, request, context):
        p = self.policy
        with self.lock:
            return scheduler_pb2.SchedulerStatus(
                handed_out=p.handed_out, leases_granted=p.counters.leases_granted,
                leases_completed=p.counters.leases_completed,
                leases_expired=p.counters.leases_expired, active_leases=len(p.leases),
                failed=len(p.failed), finished=p.finished, workers=len(p.workers), done=p.done,
                worker_versions={w: s.policy_version for w, s in p.workers.items()})


def serve(cfg: RunConfig) -> None:
    setup_logging("scheduler")
    redis, _embedded = open_redis(cfg.redis.url, cfg.run_dir, cfg.redis.socket_timeout_s)
    policy = LeasePolicy(lease_ttl_s=cfg.scheduler.lease_ttl_s,
                         max_attempts=cfg.scheduler.max_attempts,
                         max_inflight=cfg.inflight_limit, max_prompts=cfg.scheduler.max_prompts)
    servicer = SchedulerServicer(cfg, policy, redis)
    runner = ServiceRunner("scheduler", cfg.scheduler.endpoint.address,
                           [(scheduler_pb2_grpc.add_SchedulerServicer_to_server, servicer)])

    def loop(stop: threading.Event) -> None:
        while not stop.wait(0.2):
            servicer.refresh()

    runner.run(loop)
