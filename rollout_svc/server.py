"""Rollout worker process: engine + loop + a gRPC status endpoint."""

from __future__ import annotations

import logging

import torch

from relayrl.config import RunConfig
from relayrl.keys import RunKeys
from relayrl.leases import GrpcLeaseClient
from relayrl.logs import setup_logging
from relayrl.models import load_model, resolve_model_path
from relayrl.proto.v1 import rollout_pb2, rollout_pb2_grpc
from relayrl.redis_conn import open_redis
from relayrl.service import ServiceRunner
from relayrl.streams import TrajectoryWriter
from relayrl.tasks import make_task
from relayrl.weights.client import RelayClient
from rollout_svc.torch_engine import TorchEngine
from rollout_svc.worker import RolloutWorker

log = logging.getLogger(__name__)


class RolloutStatusServicer(rollout_pb2_grpc.RolloutServicer):
    def __init__(self, worker: RolloutWorker):
        self.worker = worker

    def Status(self, request, context):
        w = self.worker
        return rollout_pb2.RolloutStatus(
            worker_id=w.worker_id, policy_version=w.engine.version,
            samples_generated=w.samples_generated, weight_swaps=w.weight_swaps,
            versions_used=sorted(w.versions_used), weight_pull_failures=w.pull_failures,
            bytes_pulled=w.bytes_pulled, last_pull_s=w.last_pull_s)


def serve(cfg: RunConfig) -> None:
    setup_logging(cfg.rollout.worker_id)
    torch.set_num_threads(cfg.rollout.torch_threads)
    lm = load_model(resolve_model_path(cfg.model, cfg.task))
    engine = TorchEngine(lm, cfg.rollout)
    redis, _embedded = open_redis(cfg.redis.url, cfg.run_dir, cfg.redis.socket_timeout_s)
    scheduler = GrpcLeaseClient(cfg.scheduler.endpoint.address)
    relays = [RelayClient(a, cfg.relay.chunk_bytes, cfg.relay.timeout_s, cfg.rollout.weight_plane)
              for a in cfg.relay_addresses]
    worker = RolloutWorker(cfg, engine, lm, scheduler, relays,
                           TrajectoryWriter(redis, RunKeys(cfg.run_id)),
                           make_task(cfg.task).reward_name)
    runner = ServiceRunner(cfg.rollout.worker_id, cfg.rollout.endpoint.address,
                           [(rollout_pb2_grpc.add_RolloutServicer_to_server,
                             RolloutStatusServicer(worker))])
    runner.run(worker.run)
