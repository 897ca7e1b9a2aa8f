"""Trainer process: the model, Redis and the relay client set up, the loop
(trainer_svc.loop) run beside a gRPC status endpoint and /metrics. Under torchrun, rank 0
is that process and the other ranks follow it (trainer_svc.distributed)."""

from __future__ import annotations

import logging
import signal

import torch

from relayrl.config import TrainerRun
from relayrl.contracts.proto.v1 import trainer_pb2, trainer_pb2_grpc
from relayrl.runtime.logs import setup_logging
from relayrl.runtime.procs import set_mmap_threshold
from relayrl.runtime.redis_conn import redis_session
from relayrl.runtime.service import ServiceRunner
from relayrl_torch.models import resolve_model_path
from relayrl_torch.models.loading import load_model
from relayrl_torch.weights.client import RelayClient
from relayrl_torch.weights.signing import ManifestKeys
from trainer_svc.distributed import Parallel, init_world, leave_world
from trainer_svc.learner import Learner
from trainer_svc.loop import Trainer
from trainer_svc.publisher import AsyncPublisher
from trainer_svc.telemetry import trainer_metrics

log = logging.getLogger(__name__)


class TrainerStatusServicer(trainer_pb2_grpc.TrainerServicer):
    def __init__(self, trainer: Trainer):
        self.t = trainer

    def Status(self, request, context):
        t = self.t
        return trainer_pb2.TrainerStatus(
            step=t.step, version=t.publisher.published_version,
            samples_trained=t.totals["samples_trained"],
            samples_dropped_stale=t.totals["samples_dropped_stale"],
            reward_mean=t.latest.figures.reward_mean or 0.0, finished=t.finished)


def trainer_metrics_of(trainer: Trainer):
    return trainer_metrics(trainer.books, trainer.publisher, lambda: trainer.latest,
                           lambda: trainer.finished)


def serve(cfg: TrainerRun) -> None:
    setup_logging("trainer")
    world = init_world(cfg.trainer.device, cfg.trainer.dist_timeout_s)
    parallel = Parallel(world, cfg.trainer.fsdp)
    torch.set_num_threads(cfg.trainer.torch_threads)
    torch.manual_seed(cfg.trainer.seed)
    threshold = cfg.trainer.mmap_threshold_mib
    if threshold is not None and not set_mmap_threshold(threshold):
        log.warning("trainer.mmap_threshold_mib %d not applied: this C library has no "
                    "glibc mallopt, or refused it", threshold)
    # under torchrun each rank reads only its shard of the weights, once it is sharded
    lm = load_model(resolve_model_path(cfg.model, cfg.task), meta=world.size > 1)
    if not world.is_main:
        follow(cfg, lm, parallel)
        return
    with redis_session(cfg.redis.url, cfg.run_dir, cfg.redis.socket_timeout_s) as redis:
        to = cfg.publish
        publisher = AsyncPublisher(RelayClient(to.address, to.chunk_bytes, to.timeout_s,
                                               publish_shm_dir=to.shm_dir,
                                               keys=ManifestKeys.for_trainer(cfg.auth)),
                                   dtype=getattr(torch, cfg.model.dtype_name()))
        trainer = Trainer(cfg, lm, redis, publisher, parallel)
        log.info("trainer on %s, precision %s", world.device,
                 trainer.objective.precision.name)
        trainer.resume()
        runner = ServiceRunner("trainer", cfg.trainer.endpoint.bind_address,
                               [(trainer_pb2_grpc.add_TrainerServicer_to_server,
                                 TrainerStatusServicer(trainer))],
                               trainer_metrics_of(trainer), cfg.trainer.metrics_port,
                               max_receive_bytes=cfg.trainer.grpc_receive_bytes,
                               max_concurrent_rpcs=cfg.trainer.grpc.max_concurrent_rpcs)
        runner.run(trainer.run)
        trainer.history.close()
        publisher.close()
        trainer.metrics.close()
        # Only after a clean stop: on an error the followers may be inside a collective, and
        # torchrun ends them when rank 0 exits. Last, so that they wait for leave_world's
        # barrier no longer than rank 0 takes to reach it.
        trainer.learner.stop_followers()
    leave_world(world)


def follow(cfg: TrainerRun, lm, parallel: Parallel) -> None:
    """A rank other than 0: the same modules, running what rank 0 leads until it stops."""
    learner = Learner(cfg, lm, parallel)
    # Rank 0 turns a signal into a clean stop that still needs this rank (a last step, a
    # checkpoint), and then tells it to stop; torchrun sends the same signal to every rank.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    learner.follow()
    log.info("rank %d stopped with rank 0", parallel.world.rank)
    leave_world(parallel.world)
