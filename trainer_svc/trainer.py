"""The training loop: read a batch, drop stale groups, step, publish, checkpoint, ack.

Under torchrun this is rank 0; the other ranks run a Learner that follows it (see
trainer_svc.distributed). Checkpoint, resume and acknowledgement are in
trainer_svc.durability, mixed in here."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from relayrl.config import RunConfig
from relayrl.contracts.codec import CodecError
from relayrl.contracts.keys import TRAINER_GROUP, RunKeys, is_external
from relayrl.contracts.messages import decode_batch
from relayrl.contracts.streams import ensure_group, read_group
from relayrl.runtime.backpressure import StoppedWaiting
from relayrl.runtime.metrics import (  # noqa: F401 (tests import open_metrics)
    StepFigures,
    StepRecord,
    open_metrics,
    open_run_metrics,
)
from relayrl.runtime.outage import ride_out
from relayrl.runtime.procs import release_freed_memory
from relayrl_tasks.tasks import load_run_task
from relayrl_torch.evaluation import build_sets, evaluate_sets
from relayrl_torch.models import pretrained_dir
from relayrl_torch.models.loading import LoadedModel
from trainer_svc.batching import (
    collate,
    lag_histogram,
    split_stale,
    split_uniform,
    token_lag_histogram,
)
from trainer_svc.books import Books, RedisLink
from trainer_svc.distributed import Parallel
from trainer_svc.durability import Durability
from trainer_svc.errors import count_errors, episode_counts
from trainer_svc.learner import Learner
from trainer_svc.parity import VersionHistory, logprob_gaps, rescore_older_tokens
from trainer_svc.publisher import AsyncPublisher
from trainer_svc.setaside import SetAside
from trainer_svc.telemetry import publish_counts

log = logging.getLogger(__name__)
CONSUMER = "trainer-0"


class Trainer:
    def __init__(self, cfg: RunConfig, lm: LoadedModel, redis, publisher: AsyncPublisher,
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
        self.last_reward = 0.0
        self.latest = StepRecord(0)  # newest value of each figure, for /metrics
        self.finished = False
        self.started = time.monotonic()
        ensure_group(self.r, self.keys.batches, TRAINER_GROUP)

    # the books, read where the loop, the status API and the tests look
    step = property(lambda self: self.books.step)
    totals = property(lambda self: self.books.totals)
    ledger = property(lambda self: self.books.ledger)
    pressure = property(lambda self: self.link.pressure)

    @property
    def stop(self) -> threading.Event:
        return self.link.stop

    @stop.setter
    def stop(self, event: threading.Event) -> None:
        self.link.stop = event  # the service's stop, set on SIGTERM

    def resume(self) -> None:
        self.durable.resume()

    def save_checkpoint(self) -> None:
        self.durable.save_checkpoint()

    def next_batch(self, stop: threading.Event):
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

    def train_step(self, entry_id: bytes, batch) -> StepRecord:
        t0 = time.monotonic()
        books = self.books
        version = books.step  # the weights about to be updated are version `step`
        split = split_stale(batch, version, self.tc.max_staleness)
        varied, agreeing = split_uniform(split.kept)
        kept, uniform = split.kept, []
        if self.objective.loss.filters_uniform_groups:
            kept, uniform = varied, agreeing
        # A filtered group is finished like a stale one: not trained on, never re-issued.
        books.ledger.entry_ids.append(entry_id)
        books.ledger.dropped.extend(g.prompt_id for g in [*split.stale, *uniform])
        books.finish([g.prompt_id for g in batch.groups])
        external = sum(is_external(g.prompt_id) for g in batch.groups)
        dropped_samples = sum(len(g.samples) for g in split.stale)
        books.totals["samples_dropped_stale"] += dropped_samples
        books.totals["groups_dropped_stale"] += len(split.stale)
        filtered_samples = sum(len(g.samples) for g in uniform)
        books.totals["samples_filtered_uniform"] += filtered_samples
        books.totals["groups_filtered_uniform"] += len(uniform)
        figures = StepFigures(
            groups_dropped_stale=len(split.stale), samples_dropped_stale=dropped_samples,
            groups_filtered_uniform=len(uniform), samples_filtered_uniform=filtered_samples,
            # TRL's frac_reward_zero_std: groups that teach nothing (all right or all wrong),
            # before any filter
            groups_uniform_frac=len(agreeing) / max(len(split.kept), 1),
            # decoded, then thrown away: bench/longtail.py counts it as waste
            tokens_dropped_stale=sum(len(s.response_tokens)
                                     for g in split.stale for s in g.samples),
            external_groups=external)
        record = StepRecord(books.step + 1, figures, {
            **lag_histogram(batch, version, self.tc.max_staleness),
            **token_lag_histogram(split.kept, version, self.tc.max_staleness)})
        if kept:
            update, finite = self._optimize(kept, version)
            if not finite:  # no update, no publish, nothing trained (trainer_svc.finite)
                return self.set_aside.nonfinite_step(entry_id, batch, kept, update, record)
            record = record.updated(update)
        else:  # no update: the version about to be published holds these very weights
            self._remember(version)
        books.ledger.consumed.extend(g.prompt_id for g in kept)
        self.set_aside.passed()
        books.step += 1
        pub, f = self.publisher, record.figures  # the previous version's publish times
        f.publish_stall_s, f.publish_copy_s, f.publish_send_s = (
            pub.last_stall_s, pub.last_copy_s, pub.last_send_s)
        self.publisher.publish(books.step, books.step, self.learner.weights())
        self.link.write(self.durable.record_progress, "the trainer's version")
        record.extra.update({**publish_counts(self.publisher).figures(),
                             **books.set_aside_counters()})
        now = time.monotonic()
        record.figures.step_s = now - t0
        record.figures.elapsed_s = now - self.started
        record.figures.run_samples_per_s = books.totals["samples_trained"] / max(
            now - self.started, 1e-9)
        return record

    def _remember(self, version: int) -> None:
        """Keep `version`'s parameters for the engine check: its published file where there
        is one (shared with the relay), else a copy."""
        if self.history.keep:
            self.publisher.fence()
            self.history.remember(version, self.lm.model, self.publisher.shipped(version))

    def _optimize(self, groups, version: int) -> tuple[StepRecord, bool]:
        """(the step's figures, True), or (the loss's statistics, False) for a step not taken
        because its loss or gradient norm was not finite."""
        tb = collate(groups, version, self.lm.pad_id, self.tc.loss.scales_by_group_std)
        model = self.lm.model
        rescored = None
        if self.engine_check_seqs:
            model.train()
            with self.objective.precision.autocast():  # as the update's own passes
                rescored = rescore_older_tokens(
                    model, self.history, tb.input_ids, tb.attention_mask, tb.response_mask,
                    tb.token_versions, self.cfg.rollout.temperature, self.engine_check_seqs)

        def before_first_step() -> None:
            self.publisher.fence()  # the last published snapshot must be taken first
            if self.tc.max_staleness > 0:  # at 0 no kept token is older than its batch
                self._remember(version)

        result = self.learner.update(tb, before_first_step)
        # the pass's freed activations (about 1 GB for SmolLM2) go back to the system before
        # the version is staged into shared memory beside them
        release_freed_memory()
        loss_stats = StepRecord.from_json({f"train/{k}": v for k, v in result.stats.items()})
        if result.nonfinite:
            return loss_stats, False
        n = tb.rewards.numel()
        self.books.totals["samples_trained"] += n
        self.last_reward = tb.rewards.mean().item()
        samples = [s for g in groups for s in g.samples]
        errors = count_errors(samples, self.step + 1)
        episodes = episode_counts(samples) if self.cfg.rollout.environment else None
        figures = StepFigures(
            reward_mean=self.last_reward, reward_std=tb.rewards.std().item(), samples=n,
            groups=len(groups), tokens=int(tb.response_lengths.sum()),
            response_len_mean=tb.response_lengths.float().mean().item(),
            lag_mean=tb.lags.float().mean().item(), lag_max=int(tb.lags.max()),
            reward_errors=errors.total, reward_error_kinds=errors.reward,
            env_error_kinds=errors.environment,
            episodes=episodes[0] if episodes else None,
            turns=episodes[1] if episodes else None,
            **logprob_gaps(result.old_logprobs, tb.behaviour_logprobs, tb.response_mask,
                           tb.token_versions, version, rescored))
        return loss_stats.updated(StepRecord(self.step + 1, figures)), True

    def run_eval(self, on_update=None, stop: threading.Event | None = None) -> StepRecord:
        """Every eval set's metrics for the current weights (eval.mode inline);
        relayrl_torch.sampling.sampler.Stopped once `stop` is set."""
        t0 = time.monotonic()
        record, _ = evaluate_sets(self.lm, self.eval_sets, seed=self.cfg.eval.seed,
                                  batch_size=self.cfg.eval.batch_size, on_update=on_update,
                                  stop=stop)
        evaluated = StepRecord.from_json({"step": self.step, **record})
        evaluated.figures.eval_s = time.monotonic() - t0
        return evaluated
