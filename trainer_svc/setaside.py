"""The trainer's books for batches it sets aside: poison entries and groups (quarantined
before a step) and steps skipped because their loss or gradient norm was not finite.

Either way the groups are finished without training, exactly as a stale group is: their
prompts go to the ledger's `dropped` set when the next checkpoint acknowledges the entry, and
the trainer's count of finished prompts includes them, so the scheduler's in-flight cap frees
up and the audit's books balance. Each is counted (totals, metrics.jsonl, /metrics), logged
with its prompt ids and recorded in the run's quarantine (trainer_svc.quarantine)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from relayrl.contracts import ledger as prompt_ledger
from relayrl.contracts.keys import is_external
from relayrl.contracts.messages import Batch, Group, encode_batch
from relayrl.runtime.outage import redis_write, ride_out
from trainer_svc import checkpoint
from trainer_svc.finite import StepGuard
from trainer_svc.quarantine import Quarantine, Screened, live_limits, salvage_prompt_ids, screen

if TYPE_CHECKING:
    from trainer_svc.trainer import Trainer

log = logging.getLogger(__name__)

TOTALS = {"batches_quarantined": 0, "groups_quarantined": 0, "nonfinite_steps": 0}


class SetAside:
    def __init__(self, trainer: Trainer):
        self.t = trainer
        self.limits = live_limits(trainer.lm.model)  # what a batch's groups must fit
        self.guard = StepGuard(trainer.tc.max_nonfinite_steps)
        self.quarantine = Quarantine(trainer.r, trainer.keys, lambda write: redis_write(
            write, trainer.pressure, "the trainer's quarantine", trainer.stop))

    def _finish(self, prompt_ids: list[int]) -> None:
        """Finish prompts untrained: dropped in the ledger, counted as finished."""
        t = self.t
        t.ledger.dropped.extend(prompt_ids)
        external = sum(is_external(p) for p in prompt_ids)
        t.totals["external_groups"] += external
        t.totals["scheduler_prompts_finished"] += len(prompt_ids) - external

    def screen(self, entry_id: bytes, payload: bytes, batch: Batch) -> Batch | None:
        """The batch less the groups the model cannot train on, which are quarantined; None
        when none is left (the entry is then finished here)."""
        t = self.t
        screened: Screened = screen(batch, self.limits)
        if not screened.quarantined:
            return batch
        ids = [g.prompt_id for g in screened.quarantined]
        self.quarantine.record(entry_id, "poison", "; ".join(screened.reasons), ids, t.step,
                               batch.batch_id, payload)
        self._finish(ids)
        t.totals["groups_quarantined"] += len(ids)
        t.totals["batches_quarantined"] += 1
        if screened.batch.groups:
            return screened.batch
        t.ledger.entry_ids.append(entry_id)
        return None

    def undecodable(self, entry_id: bytes, payload: bytes | None, reason: str) -> None:
        """An entry that does not decode: quarantined whole. Its prompts are finished as far
        as they can be read from it and the buffer recorded them as batched."""
        t = self.t
        named = salvage_prompt_ids(payload)
        ids = ride_out("redis", lambda: [
            p for p in named if prompt_ledger.contains(t.r, t.keys, "batched", p)])
        self.quarantine.record(entry_id, "undecodable", reason, ids, t.step, "", payload)
        self._finish(ids)
        t.ledger.entry_ids.append(entry_id)
        t.totals["groups_quarantined"] += len(ids)
        t.totals["batches_quarantined"] += 1

    def nonfinite_step(self, entry_id: bytes, batch: Batch, kept: list[Group],
                       stats: dict[str, float], record: dict) -> dict:
        """A step whose loss or gradient norm was not finite: no update, no publish. Its
        trained groups are finished untrained (the entry is already in the ledger); after
        trainer.max_nonfinite_steps in a row, NonFiniteError (trainer_svc.finite)."""
        t = self.t
        ids = [g.prompt_id for g in kept]
        loss, grad_norm = stats.get("loss", float("nan")), stats.get("grad_norm", float("nan"))
        reason = f"step {t.step + 1}: loss {loss}, grad_norm {grad_norm} not finite"
        log.error("skipping %s (batch %s, prompts %s)", reason, batch.batch_id, ids)
        self.quarantine.record(entry_id, "nonfinite_step", reason, ids, t.step,
                               batch.batch_id, encode_batch(batch))
        t.ledger.dropped.extend(ids)  # train_step has counted them finished
        t.totals["nonfinite_steps"] += 1
        redis_write(t.record_progress, t.pressure, "the trainer's version", t.stop)
        last = checkpoint.latest(t.ckpt_dir)
        self.guard.skipped(t.step + 1, loss, grad_norm,
                        str(last) if last else "none written yet")
        return {**record, "step": t.step, "train/step_skipped": 1,
                "train/nonfinite_steps": t.totals["nonfinite_steps"]}

    def passed(self) -> None:
        """A step taken: the run of skipped ones, if any, is over."""
        self.guard.passed()

    def counters(self) -> dict[str, int]:
        """Running totals, as metrics.jsonl and /metrics name them."""
        return {f"train/{k}": self.t.totals[k] for k in TOTALS}
