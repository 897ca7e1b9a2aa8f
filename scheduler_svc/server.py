"""The Scheduler gRPC service: a thin translation of SchedulerCore."""

from __future__ import annotations

import json
import logging
import threading

import grpc

from relayrl.config import ConfigError, SchedulerRun
from relayrl.contracts.proto.v1 import scheduler_pb2, scheduler_pb2_grpc
from relayrl.runtime.auth import control_api_book
from relayrl.runtime.auth import current as current_credentials
from relayrl.runtime.backpressure import StoppedWaiting
from relayrl.runtime.logs import setup_logging
from relayrl.runtime.outage import ride_out
from relayrl.runtime.redis_conn import redis_session
from relayrl.runtime.reply_faults import with_lost_replies
from relayrl.runtime.service import ServiceRunner
from scheduler_svc.core import REFRESH_S, SchedulerCore
from scheduler_svc.telemetry import scheduler_metrics

log = logging.getLogger(__name__)
# what a chaos test may lose the replies of (relayrl.runtime.reply_faults); Status is how it watches
LOSABLE_METHODS = ("Register", "AcquireLeases", "Complete", "SaveProgress", "Release",
                   "Heartbeat")


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, core: SchedulerCore):
        self.core = core

    def Register(self, request, context):
        try:
            self.core.register(request.worker_id, request.address, request.incarnation)
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        s = self.core.cfg.scheduler
        return scheduler_pb2.RegisterResponse(run_id=self.core.cfg.run_id,
                                              lease_ttl_s=s.lease_ttl_s,
                                              heartbeat_interval_s=s.heartbeat_interval_s)

    def AcquireLeases(self, request, context):
        try:
            batch = self.core.acquire(request.worker_id, request.max_prompts,
                                      request.request_id)
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        ttl = self.core.cfg.scheduler.lease_ttl_s
        leases = [scheduler_pb2.Lease(
            lease_id=lp.lease_id, attempt=lp.attempt, ttl_s=ttl,
            prompt=scheduler_pb2.Prompt(
                prompt_id=lp.prompt_id, text=lp.text, reference=lp.reference,
                messages=[scheduler_pb2.ChatMessage(**m) for m in lp.messages],
                metadata_json=json.dumps(lp.metadata) if lp.metadata else ""),
            partial_state=lp.partial_state, kv_states=lp.kv_states)
            for lp in batch.leases]
        return scheduler_pb2.LeaseResponse(leases=leases, done=batch.done,
                                           retry_after_s=batch.retry_after_s,
                                           min_policy_version=batch.min_version)

    def Complete(self, request, context):
        return scheduler_pb2.CompleteResponse(
            accepted=self.core.complete(request.worker_id, request.lease_id))

    def SaveProgress(self, request, context):
        try:
            reply = self.core.save_progress(request.worker_id, request.lease_id, request.state)
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return scheduler_pb2.SaveProgressResponse(accepted=reply.accepted, release=reply.release)

    def Release(self, request, context):
        try:
            accepted = self.core.release(request.worker_id, request.lease_id, request.state,
                                         tuple(request.kv_states))
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return scheduler_pb2.ReleaseResponse(accepted=accepted)

    def Heartbeat(self, request, context):
        held = list(request.held.lease_ids) if request.HasField("held") else None
        remaining = context.time_remaining()
        try:
            known = self.core.heartbeat(request.worker_id, request.policy_version, held,
                                        fresh=remaining is None or remaining > 0)
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return scheduler_pb2.HeartbeatResponse(known=known)

    def Status(self, request, context):
        p = self.core.policy
        with self.core.lock:
            return scheduler_pb2.SchedulerStatus(
                handed_out=p.handed_out, leases_granted=p.counters.leases_granted,
                leases_completed=p.counters.leases_completed,
                leases_expired=p.counters.leases_expired, active_leases=len(p.leases),
                leases_released=p.counters.leases_released,
                leases_recalled=p.counters.leases_recalled,
                leases_moved=p.counters.leases_moved,
                leases_unheld=p.counters.leases_unheld,
                partial_groups=len(self.core.saved.partials),
                failed=len(p.failed), finished=p.finished, workers=len(p.workers), done=p.done,
                worker_versions={w: s.policy_version for w, s in p.workers.items()},
                worker_leases=p.leases_by_worker())


def serve(cfg: SchedulerRun) -> None:
    setup_logging("scheduler")
    with redis_session(cfg.redis.url, cfg.run_dir, cfg.redis.socket_timeout_s) as redis:
        core = SchedulerCore(cfg, redis)
        servicer = with_lost_replies(SchedulerServicer(core), "Scheduler", LOSABLE_METHODS)
        runner = ServiceRunner("scheduler", cfg.scheduler.endpoint.bind_address,
                               [(scheduler_pb2_grpc.add_SchedulerServicer_to_server, servicer)],
                               scheduler_metrics(core), cfg.scheduler.metrics_port,
                               max_receive_bytes=cfg.scheduler.grpc_receive_bytes,
                               max_concurrent_rpcs=cfg.scheduler.grpc.max_concurrent_rpcs)

        rest = None
        sc = cfg.scheduler
        if sc.rest_port:
            token = control_api_book(current_credentials(), sc.rest_token_env)
            if token is None:
                raise ConfigError(f"scheduler.rest_port is set but ${sc.rest_token_env} is empty "
                                 f"and so is the run token (auth.required is false): "
                                 "the control API needs a bearer token")
            from relayrl.runtime.http_server import BackgroundHTTPServer
            from scheduler_svc.rest import build_rest_app

            rest = BackgroundHTTPServer(build_rest_app(core, token), sc.rest_host, sc.rest_port,
                                        "scheduler-rest")
            rest.start()

        def loop(stop: threading.Event) -> None:
            try:
                while not stop.wait(REFRESH_S):
                    ride_out("redis", core.refresh, stop)  # each of its writes is idempotent
            except StoppedWaiting:
                pass

        try:
            runner.run(loop)
        finally:
            if rest is not None:
                rest.stop()
