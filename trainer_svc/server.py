"""Trainer process: the loop, a progress bar, and a gRPC status endpoint. Under torchrun,
rank 0 is that process and the other ranks follow it (trainer_svc.distributed)."""

from __future__ import annotations

import logging
import signal
import threading
import time

import torch

from relayrl.config import RunConfig
from relayrl.contracts.proto.v1 import trainer_pb2, trainer_pb2_grpc
from relayrl.runtime.backpressure import StoppedWaiting
from relayrl.runtime.logs import setup_logging
from relayrl.runtime.metrics import StepRecord
from relayrl.runtime.procs import set_mmap_threshold
from relayrl.runtime.redis_conn import redis_session
from relayrl.runtime.service import ServiceRunner
from relayrl_torch.evaluation.runner import sequences
from relayrl_torch.models import resolve_model_path
from relayrl_torch.models.loading import load_model
from relayrl_torch.sampling.sampler import Stopped
from relayrl_torch.weights.client import RelayClient
from relayrl_torch.weights.signing import ManifestKeys
from trainer_svc.distributed import Parallel, close_world, init_world
from trainer_svc.learner import Learner
from trainer_svc.operator import OperatorSignals
from trainer_svc.plots import Plotter
from trainer_svc.publisher import AsyncPublisher
from trainer_svc.telemetry import tokens_generated, trainer_metrics
from trainer_svc.trainer import Trainer

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
            reward_mean=t.last_reward, finished=t.finished)


def trainer_metrics_of(trainer: Trainer):
    return trainer_metrics(trainer.books, trainer.publisher, lambda: trainer.latest,
                           lambda: trainer.finished)


def _progress(trainer: Trainer, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=trainer.tc.max_steps, initial=trainer.step, desc="train",
                disable=not enabled, dynamic_ncols=True)


def evaluate(trainer: Trainer, stop: threading.Event) -> StepRecord | None:
    """The eval record of the trainer's current weights, with a progress bar that shows how
    long it will take; None (and nothing of it kept) when told to stop meanwhile."""
    from tqdm import tqdm

    total = sequences(trainer.eval_sets)
    log.info("evaluating version %d: %d sequences of up to %d tokens (eval.every %d; "
             "eval.mode separate evaluates beside training, eval.at_start false skips "
             "version 0)", trainer.step, total, trainer.cfg.rollout.max_new_tokens,
             trainer.cfg.eval.every)
    bar = tqdm(total=total, desc=f"eval v{trainer.step}", unit="seq", leave=False,
               disable=not trainer.tc.progress, dynamic_ncols=True)
    try:
        record = trainer.run_eval(lambda done, _: bar.update(done - bar.n), stop)
    except Stopped:
        log.info("evaluation of version %d stopped; the run stops without it", trainer.step)
        return None
    finally:
        bar.close()
    log.info("evaluated version %d in %.1f s", trainer.step, record.figures.eval_s)
    return record


class Throughput:
    """Samples and tokens trained per second over about the last 30 s: the figures of the
    steps that ended in the window, over the time since the step before them ended (the
    loop's start for the first), so a window of one long step still has a rate."""

    WINDOW_S = 30.0

    def __init__(self, link) -> None:
        self.link = link
        # (end time, samples, tokens trained, tokens generated so far) of recent steps
        self.marks = [(time.monotonic(), 0, 0, tokens_generated(link))]

    def record(self, figures) -> None:
        now = time.monotonic()
        self.marks.append((now, figures.samples or 0, figures.tokens or 0,
                           tokens_generated(self.link)))
        while len(self.marks) > 2 and now - self.marks[1][0] >= self.WINDOW_S:
            self.marks.pop(0)  # the window starts where its oldest step began
        start, counted = self.marks[0], self.marks[1:]
        span = max(now - start[0], 1e-6)
        figures.samples_per_s = sum(m[1] for m in counted) / span
        figures.tokens_per_s = sum(m[2] for m in counted) / span
        figures.generated_tokens_per_s = max(counted[-1][3] - start[3], 0) / span
        if figures.step_s:
            figures.trainer_tokens_per_s = (figures.tokens or 0) / figures.step_s


def run_loop(trainer: Trainer, stop: threading.Event) -> None:
    tc = trainer.tc
    trainer.stop = stop
    every = trainer.cfg.eval.every
    halted = False
    if trainer.step == 0 and every and trainer.evaluates and trainer.cfg.eval.at_start:
        record = evaluate(trainer, stop)
        halted = record is None
        if record is not None:
            trainer.metrics.write(record)
            trainer.latest = record
    if trainer.step > 0:  # resumed: make sure the relay serves what the trainer holds
        trainer.publisher.publish(trainer.step, trainer.step, trainer.learner.weights())
    operator = OperatorSignals(trainer)
    halt = operator.watch(stop)  # set by a signal, or by a graceful stop once it is due
    plots = Plotter(trainer.metrics.path, trainer.run_dir, trainer.cfg.run_id)
    bar = _progress(trainer, tc.progress)
    throughput = Throughput(trainer.link)
    acc = float("nan")
    while not halted and trainer.step < tc.max_steps and not halt.is_set():
        operator.apply_settings()
        got = trainer.next_batch(halt)
        if got is None:
            break
        before = trainer.step
        try:
            record = trainer.train_step(*got)
        except StoppedWaiting:  # told to stop while Redis was away: the checkpoint decides
            break
        if trainer.step == before:  # skipped: not finite (trainer_svc.finite); no new version
            trainer.metrics.write(record)
            operator.publish(record.to_json())
            trainer.latest = trainer.latest.updated(record)
            continue
        figures = record.figures
        figures.max_staleness = operator.settings.max_staleness
        figures.temperature = operator.settings.temperature
        throughput.record(figures)
        if trainer.evaluates and every and (trainer.step % every == 0
                                            or trainer.step == tc.max_steps):
            evaluated = evaluate(trainer, stop)
            if evaluated is None:  # the step itself is kept: written and checkpointed below
                halted = True
            else:
                record = record.updated(evaluated)
                acc = record.figures.accuracy_sampled
        trainer.metrics.write(record)
        operator.publish(record.to_json())
        trainer.latest = trainer.latest.updated(record)
        if trainer.step % tc.checkpoint.every == 0:
            trainer.save_checkpoint()
        if trainer.step % tc.plot_every == 0:
            plots.request()
        bar.update(1)
        bar.set_postfix(_postfix(record.figures, trainer.last_reward, acc))
    bar.close()
    try:
        trainer.save_checkpoint()  # first: the wait for the relay may be long (an outage)
    except StoppedWaiting:  # on disk, unacknowledged: a resume acknowledges it again
        log.error("stopping with Redis unreachable: checkpoint %d is written but its batches "
                  "are not acknowledged; a resumed trainer acknowledges them", trainer.step)
    trainer.publisher.wait(stop)  # the final version at the relay, unless told to stop
    plots.close()
    trainer.finished = trainer.step >= tc.max_steps
    halt.set()  # ends the watcher
    log.info("trainer %s at step %d", "finished" if trainer.finished else "stopped", trainer.step)


def _postfix(f, reward: float, acc: float) -> dict[str, str]:
    out = {"reward": f"{reward:.2f}", "acc": f"{acc:.2f}", "sps": f"{f.samples_per_s or 0:.1f}",
           "lag": f"{f.lag_mean or 0:.1f}"}
    if f.episodes is not None:
        out["turns"] = f"{(f.turns or 0) / max(f.episodes, 1):.1f}"
    if f.reward_errors:
        out["errors"] = str(f.reward_errors)
    return out


def serve(cfg: RunConfig) -> None:
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
        shm_dir = cfg.relay.shm_dir if cfg.trainer.publish_plane == "shm" else None
        publisher = AsyncPublisher(RelayClient(cfg.relay.endpoint.address, cfg.relay.chunk_bytes,
                                               cfg.relay.timeout_s, publish_shm_dir=shm_dir,
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
        runner.run(lambda stop: run_loop(trainer, stop))
        trainer.history.close()
        publisher.close()
        trainer.metrics.close()
        # Only after a clean stop: on an error the followers may be inside a collective, and
        # torchrun ends them when rank 0 exits. Last, so that they wait for close_world's
        # barrier no longer than rank 0 takes to reach it.
        trainer.learner.stop_followers()
        close_world(world)


def follow(cfg: RunConfig, lm, parallel: Parallel) -> None:
    """A rank other than 0: the same modules, running what rank 0 leads until it stops."""
    learner = Learner(cfg, lm, parallel)
    # Rank 0 turns a signal into a clean stop that still needs this rank (a last step, a
    # checkpoint), and then tells it to stop; torchrun sends the same signal to every rank.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    learner.follow()
    log.info("rank %d stopped with rank 0", parallel.world.rank)
    close_world(parallel.world)
