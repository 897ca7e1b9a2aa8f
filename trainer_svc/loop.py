"""The trainer's loop, top to bottom: set up, then per step take the live settings, wait for
a batch, drop its stale (and, for dapo, uniform) groups, update, publish the new version,
checkpoint and acknowledge, and write the step's record.

`Trainer.train_step` returns what the step did as one `StepResult`; its record is built from
that once (trainer_svc.record). The numeric parts are modules of their own: the objective and
its losses (trainer_svc.objective, trainer_svc.losses), micro-batches, the shared prompt
prefix and the distributed ranks. What makes the books durable (checkpoint, resume,
acknowledgement) is trainer_svc.durability; batches set aside before or by a step are
trainer_svc.setaside's. Under torchrun this is rank 0; the other ranks run a Learner that
follows it (trainer_svc.distributed).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from relayrl.config import ConfigError, TrainerRun
from relayrl.contracts import control
from relayrl.contracts.codec import CodecError
from relayrl.contracts.keys import TRAINER_GROUP, RunKeys
from relayrl.contracts.messages import Batch, Group, decode_batch
from relayrl.contracts.streams import ensure_group, read_group
from relayrl.runtime.backpressure import StoppedWaiting
from relayrl.runtime.metrics import StepFigures, StepRecord, open_run_metrics
from relayrl.runtime.outage import ride_out
from relayrl.runtime.procs import release_freed_memory
from relayrl_tasks.tasks import load_run_task
from relayrl_torch.evaluation import build_sets, evaluate_sets
from relayrl_torch.evaluation.runner import sequences
from relayrl_torch.models import pretrained_dir
from relayrl_torch.models.loading import LoadedModel
from relayrl_torch.models.routing import routers
from relayrl_torch.sampling.sampler import Stopped
from trainer_svc.batching import TrainBatch, collate, split_stale, split_uniform
from trainer_svc.books import Books, RedisLink
from trainer_svc.distributed import Parallel
from trainer_svc.durability import Durability
from trainer_svc.learner import Learner
from trainer_svc.objective import UpdateResult
from trainer_svc.operator import Operator
from trainer_svc.parity import VersionHistory, rescore_older_tokens
from trainer_svc.plots import Plotter
from trainer_svc.publisher import AsyncPublisher
from trainer_svc.record import (
    Evaluation,
    StepResult,
    Throughput,
    eval_record,
    step_record,
)
from trainer_svc.setaside import SetAside
from trainer_svc.telemetry import publish_counts, tokens_generated

log = logging.getLogger(__name__)
CONSUMER = "trainer-0"


class Trainer:
    def __init__(self, cfg: TrainerRun, lm: LoadedModel, redis, publisher: AsyncPublisher,
                 parallel: Parallel | None = None):
        self.cfg = cfg
        self.tc = cfg.trainer
        self.lm = lm
        self.r = redis
        self.keys = RunKeys(cfg.run_id)
        self.publisher = publisher
        self.learner = Learner(cfg, lm, parallel)
        self.objective = self.learner.objective
        self.optimizer = self.learner.optimizer
        # a dense model has no routes to replay: trainer.routing_replay changes nothing there
        self.replays_routes = self.tc.routing_replay and bool(routers(lm.model))
        if self.replays_routes and self.tc.activation_checkpointing:
            raise ConfigError("trainer.routing_replay with trainer.activation_checkpointing: "
                              "the backward pass's recomputed layers would route by "
                              f"themselves ({lm.model.config.model_type} is a mixture of "
                              "experts); turn one of them off")
        # Eval and the engine check run the model on rank 0 alone, which a model split over
        # ranks cannot do: off under torchrun for now.
        single = not self.learner.parallel.active
        # eval.every 0 evaluates nothing: its sets are neither built nor refused
        self.evaluates = single and cfg.eval.mode == "inline" and cfg.eval.every > 0
        self.engine_check_seqs = self.tc.engine_check_seqs if single else 0
        if self.learner.parallel.active:
            log.warning("under torchrun the trainer runs no eval and no engine check "
                        "(eval.every, trainer.engine_check_seqs); eval.mode separate does")
        self.task = load_run_task(cfg, pretrained_dir)
        # built at start-up, so a bad eval set stops the trainer before the first step
        self.eval_sets = build_sets(cfg, self.task) if self.evaluates else []
        self.run_dir = Path(cfg.run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.metrics = open_run_metrics(cfg)
        self.history = VersionHistory(self.tc.engine_check_versions if self.engine_check_seqs
                                      else 0)
        self.books = Books()
        self.link = RedisLink(redis, self.keys)
        self.durable = Durability(self.books, self.link, self.learner, lm.model, self.ckpt_dir,
                                  self.tc.checkpoint.keep)
        self.seen_up_to = b"0"  # id of the last batch entry this process was handed
        self.set_aside = SetAside(self.books, self.link, lm.model, self.tc.max_nonfinite_steps,
                                  self.ckpt_dir, self.durable.record_progress)
        self.operator = Operator(redis, self.keys, cfg)
        # the live ones, taken every step
        self.settings = control.configured_settings(cfg.live)
        self._warned_temperature = False
        self.latest = StepRecord(0)  # newest value of each figure, for /metrics
        self.finished = False
        self.started = time.monotonic()
        ensure_group(self.r, self.keys.batches, TRAINER_GROUP)

    # the books, read where the status API and the tests look
    step = property(lambda self: self.books.step)
    totals = property(lambda self: self.books.totals)

    def resume(self) -> None:
        self.durable.resume()

    def save_checkpoint(self) -> None:
        self.durable.save_checkpoint()

    def run(self, stop: threading.Event) -> None:
        """Train until trainer.max_steps, a graceful stop or `stop` (the service's, set on
        SIGTERM); then checkpoint, and wait for the last version to reach the relay."""
        tc, every = self.tc, self.cfg.eval.every
        self.link.stop = stop  # once set, a write gives up rather than wait out an outage
        halted = False
        if self.step == 0 and self.evaluates and self.cfg.eval.at_start:
            evaluated = self.evaluate(stop)
            halted = evaluated is None
            if evaluated is not None:
                self._report(eval_record(0, evaluated))
        if self.step > 0:  # resumed: make sure the relay serves what the trainer holds
            self.publisher.publish(self.step, self.step, self.learner.weights())
        # set by a signal, or by a graceful stop once it is due
        halt = self.operator.watch(stop, lambda: self.totals["scheduler_prompts_finished"])
        plots = Plotter(self.metrics.path, self.run_dir, self.cfg.run_id)
        bar = _progress(self)
        throughput = Throughput(lambda: tokens_generated(self.link))
        while not halted and self.step < tc.max_steps and not halt.is_set():
            self._take_settings()
            got = self.next_batch(halt)
            if got is None:
                break
            try:
                result = self.train_step(*got)
            except StoppedWaiting:  # told to stop while Redis was away: the checkpoint decides
                break
            if result.taken:
                result.rates = throughput.rates(*result.trained())
                if self.evaluates and (self.step % every == 0 or self.step == tc.max_steps):
                    result.evaluated = self.evaluate(stop)
                    # without its eval the step is kept: written and checkpointed below
                    halted = result.evaluated is None
            self._report(step_record(result))
            if not result.taken:  # not finite (trainer_svc.finite): no new version
                continue
            if self.step % tc.checkpoint.every == 0:
                self.save_checkpoint()
            if self.step % tc.plot_every == 0:
                plots.request()
            bar.update(1)
            bar.set_postfix(_postfix(self.latest.figures))
        bar.close()
        try:
            self.save_checkpoint()  # first: the wait for the relay may be long (an outage)
        except StoppedWaiting:  # on disk, unacknowledged: a resume acknowledges it again
            log.error("stopping with Redis unreachable: checkpoint %d is written but its "
                      "batches are not acknowledged; a resumed trainer acknowledges them",
                      self.step)
        self.publisher.wait(stop)  # the final version at the relay, unless told to stop
        plots.close()
        self.finished = self.step >= tc.max_steps
        halt.set()  # ends the watcher
        log.info("trainer %s at step %d", "finished" if self.finished else "stopped", self.step)

    def _take_settings(self) -> None:
        """The operator's live settings for the next step; the loss (and the engine check)
        rescore at the live sampling temperature."""
        settings = self.operator.settings(self.settings)
        if settings == self.settings:
            return
        if not self.learner.parallel.active:
            self.objective.temperature = settings.temperature
        elif settings.temperature != self.settings.temperature and not self._warned_temperature:
            log.warning("under torchrun the trainer keeps rescoring at temperature %s",
                        self.objective.temperature)
            self._warned_temperature = True
        log.info("live settings at step %d: %s", self.step, settings.model_dump())
        self.settings = settings

    def next_batch(self, stop: threading.Event) -> tuple[bytes, Batch] | None:
        """The next batch entry for this consumer, in stream order. Entries already delivered
        to it but never seen by this process come first: after a restart, those trained
        since the last checkpoint; mid-run, one whose delivery reply Redis never sent (it
        died after XREADGROUP moved the entry to this consumer's pending list, and the
        client's retry asked for the next new entry)."""
        while not stop.is_set():
            try:  # a read whose reply an outage lost is the pending one the next read finds
                entries = ride_out("redis", self._read_batch, stop)
            except StoppedWaiting:
                return None
            if entries:
                self.seen_up_to = entries[-1][0]
            for entry_id, payload in entries:
                try:
                    if payload is None:
                        raise CodecError("batch entry has no data")
                    batch = decode_batch(payload)
                except CodecError as err:  # quarantined, and finished: never read again
                    self.set_aside.undecodable(entry_id, payload, str(err))
                    continue
                batch = self.set_aside.screen(entry_id, payload, batch)
                if batch is not None:
                    return entry_id, batch
        return None

    def _read_batch(self) -> list[tuple[bytes, bytes | None]]:
        entries = read_group(self.r, self.keys.batches, TRAINER_GROUP, CONSUMER,
                             count=1, block_ms=0, pending_after=self.seen_up_to)
        return entries or read_group(self.r, self.keys.batches, TRAINER_GROUP, CONSUMER,
                                     count=1, block_ms=500)

    def train_step(self, entry_id: bytes, batch: Batch) -> StepResult:
        """Train on a batch entry and publish the new version; a step whose loss or gradient
        norm is not finite is not taken (no update, no version)."""
        t0 = time.monotonic()
        books, settings = self.books, self.settings
        version = books.step  # the weights about to be updated are version `step`
        split = split_stale(batch, version, settings.max_staleness)
        varied, agreeing = split_uniform(split.kept)
        kept, uniform = split.kept, []
        if self.objective.loss.filters_uniform_groups:
            kept, uniform = varied, agreeing
        # A filtered group is finished like a stale one: not trained on, never re-issued.
        books.ledger.entry_ids.append(entry_id)
        books.ledger.dropped.extend(g.prompt_id for g in [*split.stale, *uniform])
        books.finish([g.prompt_id for g in batch.groups])
        books.left_out(split.stale, uniform)
        result = StepResult(version, batch, settings, split.stale, uniform, kept,
                            agreeing=len(agreeing), episodes=self.cfg.generation.episodes)
        if kept:
            result.tb, result.update, result.rescored = self._update(kept, version)
            if result.update.nonfinite:
                self.set_aside.nonfinite_step(entry_id, batch, kept, result.update.stats)
                result.taken = False
                result.set_aside = books.set_aside_counters()
                return result
            books.trained(result.tb.rewards.numel())
        else:  # no update: the version about to be published holds these very weights
            self._remember(version)
        books.ledger.consumed.extend(g.prompt_id for g in kept)
        self.set_aside.passed()
        books.step += 1
        pub = self.publisher
        result.publish_times = pub.last_stall_s, pub.last_copy_s, pub.last_send_s
        pub.publish(books.step, books.step, self.learner.weights())
        self.link.write(self.durable.record_progress, "the trainer's version")
        result.publish_counts = publish_counts(pub).figures()
        result.set_aside = books.set_aside_counters()
        now = time.monotonic()
        result.step_s, result.elapsed_s = now - t0, now - self.started
        result.samples_trained = books.totals["samples_trained"]
        return result

    def _update(self, groups: list[Group], version: int
                ) -> tuple[TrainBatch, UpdateResult, object]:
        """The collated batch, the update on it, and the engine check's re-scored tokens."""
        tb = collate(groups, version, self.lm.pad_id, self.tc.loss.scales_by_group_std,
                     replay=self.replays_routes)
        model = self.lm.model
        rescored = None
        if self.engine_check_seqs:
            model.train()
            with self.objective.precision.autocast():  # as the update's own passes
                rescored = rescore_older_tokens(
                    model, self.history, tb.input_ids, tb.attention_mask, tb.response_mask,
                    tb.token_versions, self.settings.temperature, self.engine_check_seqs,
                    tb.routes)

        def before_first_step() -> None:
            self.publisher.fence()  # the last published snapshot must be taken first
            if self.settings.max_staleness > 0:  # at 0 no kept token is older than its batch
                self._remember(version)

        update = self.learner.update(tb, before_first_step)
        # the pass's freed activations (about 1 GB for SmolLM2) go back to the system before
        # the version is staged into shared memory beside them
        release_freed_memory()
        return tb, update, rescored

    def _remember(self, version: int) -> None:
        """Keep `version`'s parameters for the engine check: its published file where there
        is one (shared with the relay), else a copy."""
        if self.history.keep:
            self.publisher.fence()
            self.history.remember(version, self.lm.model, self.publisher.shipped(version))

    def evaluate(self, stop: threading.Event) -> Evaluation | None:
        """The eval sets' figures for the current weights, with a progress bar that shows how
        long it will take; None (and nothing of it kept) when told to stop meanwhile."""
        from tqdm import tqdm

        total = sequences(self.eval_sets)
        log.info("evaluating version %d: %d sequences of up to %d tokens (eval.every %d; "
                 "eval.mode separate evaluates beside training, eval.at_start false skips "
                 "version 0)", self.step, total, self.cfg.generation.max_new_tokens,
                 self.cfg.eval.every)
        bar = tqdm(total=total, desc=f"eval v{self.step}", unit="seq", leave=False,
                   disable=not self.tc.progress, dynamic_ncols=True)
        try:
            evaluated = self.run_eval(lambda done, _: bar.update(done - bar.n), stop)
        except Stopped:
            log.info("evaluation of version %d stopped; the run stops without it", self.step)
            return None
        finally:
            bar.close()
        log.info("evaluated version %d in %.1f s", self.step, evaluated.seconds)
        return evaluated

    def run_eval(self, on_update=None, stop: threading.Event | None = None) -> Evaluation:
        """Every eval set's figures for the current weights (eval.mode inline);
        relayrl_torch.sampling.sampler.Stopped once `stop` is set."""
        t0 = time.monotonic()
        figures, _ = evaluate_sets(self.lm, self.eval_sets, seed=self.cfg.eval.seed,
                                   batch_size=self.cfg.eval.batch_size, on_update=on_update,
                                   stop=stop)
        return Evaluation(figures, time.monotonic() - t0)

    def _report(self, record: StepRecord) -> None:
        """A record to metrics.jsonl, the control API's recent figures and /metrics."""
        self.metrics.write(record)
        self.operator.publish(record.to_json())
        self.latest = self.latest.updated(record)


def _progress(trainer: Trainer):
    from tqdm import tqdm

    return tqdm(total=trainer.tc.max_steps, initial=trainer.step, desc="train",
                disable=not trainer.tc.progress, dynamic_ncols=True)


def _postfix(f: StepFigures) -> dict[str, str]:
    """The progress bar's figures: the newest of each."""
    acc = float("nan") if f.accuracy_sampled is None else f.accuracy_sampled
    out = {"reward": f"{f.reward_mean or 0:.2f}", "acc": f"{acc:.2f}",
           "sps": f"{f.samples_per_s or 0:.1f}", "lag": f"{f.lag_mean or 0:.1f}"}
    if f.episodes is not None:
        out["turns"] = f"{(f.turns or 0) / max(f.episodes, 1):.1f}"
    if f.reward_errors:
        out["errors"] = str(f.reward_errors)
    return out
