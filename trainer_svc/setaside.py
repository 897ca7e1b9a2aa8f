"""The trainer's books for batches it sets aside: poison entries and groups (quarantined
before a step) and steps skipped because their loss or gradient norm was not finite.

Either way the groups are finished without training, exactly as a stale group is: their
prompts go to the ledger's `dropped` set when the next checkpoint acknowledges the entry, and
the trainer's count of finished prompts includes them, so the scheduler's in-flight cap frees
up and the audit's books balance. Each is counted (totals, metrics.jsonl, /metrics), logged
with its prompt ids and recorded in the run's quarantine (trainer_svc.quarantine). The
totals are the trainer's books (trainer_svc.books), handed in."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from relayrl.contracts import ledger as prompt_ledger
from relayrl.contracts.messages import Batch, Group, encode_batch
from relayrl.runtime.outage import ride_out
from trainer_svc import checkpoint
from trainer_svc.books import Books, RedisLink
from trainer_svc.finite import StepGuard
from trainer_svc.quarantine import Quarantine, Screened, live_limits, salvage_prompt_ids, screen

log = logging.getLogger(__name__)


class SetAside:
    def __init__(self, books: Books, link: RedisLink, model: torch.nn.Module,
                 max_nonfinite_steps: int, ckpt_dir: Path, record_progress: Callable[[], None]):
        self.books = books
        self.link = link
        self.ckpt_dir = ckpt_dir
        self.record_progress = record_progress
        self.limits = live_limits(model)  # what a batch's groups must fit
        self.guard = StepGuard(max_nonfinite_steps)
        self.quarantine = Quarantine(link.r, link.keys, lambda write: link.write(
            write, "the trainer's quarantine"))

    def screen(self, entry_id: bytes, payload: bytes, batch: Batch) -> Batch | None:
        """The batch less the groups the model cannot train on, which are quarantined; None
        when none is left (the entry is then finished here)."""
        b = self.books
        screened: Screened = screen(batch, self.limits)
        if not screened.quarantined:
            return batch
        ids = [g.prompt_id for g in screened.quarantined]
        self.quarantine.record(entry_id, "poison", "; ".join(screened.reasons), ids, b.step,
                               batch.batch_id, payload)
        b.quarantined(ids)
        if screened.batch.groups:
            return screened.batch
        b.ledger.entry_ids.append(entry_id)
        return None

    def undecodable(self, entry_id: bytes, payload: bytes | None, reason: str) -> None:
        """An entry that does not decode: quarantined whole. Its prompts are finished as far
        as they can be read from it and the buffer recorded them as batched."""
        b, link = self.books, self.link
        named = salvage_prompt_ids(payload)
        ids = ride_out("redis", lambda: [
            p for p in named if prompt_ledger.contains(link.r, link.keys, "batched", p)])
        self.quarantine.record(entry_id, "undecodable", reason, ids, b.step, "", payload)
        b.quarantined(ids)
        b.ledger.entry_ids.append(entry_id)

    def nonfinite_step(self, entry_id: bytes, batch: Batch, kept: list[Group],
                       stats: dict[str, float]) -> None:
        """A step whose loss or gradient norm was not finite: no update, no publish. Its
        trained groups are finished untrained (the entry is already in the ledger); after
        trainer.max_nonfinite_steps in a row, NonFiniteError (trainer_svc.finite)."""
        b = self.books
        ids = [g.prompt_id for g in kept]
        loss, grad_norm = (float(stats.get(k, float("nan"))) for k in ("loss", "grad_norm"))
        reason = f"step {b.step + 1}: loss {loss}, grad_norm {grad_norm} not finite"
        log.error("skipping %s (batch %s, prompts %s)", reason, batch.batch_id, ids)
        self.quarantine.record(entry_id, "nonfinite_step", reason, ids, b.step,
                               batch.batch_id, encode_batch(batch))
        b.skipped(ids)  # the step has counted them finished
        self.link.write(self.record_progress, "the trainer's version")
        last = checkpoint.latest(self.ckpt_dir)
        self.guard.skipped(b.step + 1, loss, grad_norm,
                           str(last) if last else "none written yet")

    def passed(self) -> None:
        """A step taken: the run of skipped ones, if any, is over."""
        self.guard.passed()
