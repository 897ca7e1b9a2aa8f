"""What makes the trainer's books (trainer_svc.books) durable: checkpoint and resume, the
acknowledgement that finishes a checkpoint's batch entries and prompts, and the trainer
version and prompts finished that the scheduler reads.

A batch entry is acknowledged (XACK, XDEL, its prompts marked consumed or dropped) only
once the checkpoint that trained it is on disk, so a restart resumes exactly: the entries
trained since the last checkpoint are read and trained again. Exercised by
tests/integration/test_trainer_resume.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from relayrl.contracts import ledger as prompt_ledger
from relayrl.contracts.keys import TRAINER_GROUP
from relayrl.runtime.progress import announce_step
from trainer_svc import checkpoint
from trainer_svc.books import Books, RedisLink
from trainer_svc.learner import Learner

log = logging.getLogger(__name__)


class Durability:
    def __init__(self, books: Books, link: RedisLink, learner: Learner, model: torch.nn.Module,
                 ckpt_dir: Path, keep: int):
        self.books = books
        self.link = link
        self.learner = learner
        self.model = model
        self.ckpt_dir = ckpt_dir
        self.keep = keep

    def resume(self) -> None:
        path = checkpoint.latest(self.ckpt_dir)
        if path is None:
            return
        state = checkpoint.load_state(path)
        self.learner.restore(state["extra"].get("objective", {}),
                             checkpoint.load_weights(path, self.learner.lora),
                             state["optimizer"], state.get("optimizer_by_name", False))
        self.books.restore(state["step"], state["extra"]["totals"])
        self._acknowledge(state["ledger"])  # idempotent if it was already acknowledged
        log.info("resumed from %s at step %d", path, self.books.step)

    def _acknowledge(self, ledger: checkpoint.Ledger) -> None:
        r, keys = self.link.r, self.link.keys

        def write() -> None:
            pipe = r.pipeline(transaction=True)
            if ledger.entry_ids:
                pipe.xack(keys.batches, TRAINER_GROUP, *ledger.entry_ids)
                pipe.xdel(keys.batches, *ledger.entry_ids)
            prompt_ledger.add(pipe, keys, "consumed", ledger.consumed)
            prompt_ledger.add(pipe, keys, "dropped", ledger.dropped)
            pipe.execute()

        # MULTI/EXEC of XACK, XDEL and SADD: repeating it after a timeout changes nothing
        self.link.write(write, "the trainer's acknowledgement")

    def save_checkpoint(self) -> None:
        """Write this step's checkpoint, then acknowledge what it trained. One already on disk
        for this step, with nothing read since, is not written again: the loop's periodic
        save at max_steps and the final save would write SmolLM2's 1.6 GB twice, the second
        fsync waiting behind the first's writeback (26 s measured)."""
        b = self.books
        if b.saved_step == b.step and b.ledger == checkpoint.Ledger():
            return
        state = self.learner.training_state()
        extra = {"totals": b.totals, "objective": state.objective}
        checkpoint.save(self.ckpt_dir, b.step, self.model, state, b.ledger, extra, self.keep)
        self._acknowledge(b.ledger)
        b.ledger = checkpoint.Ledger()
        b.saved_step = b.step

    def record_progress(self) -> None:
        """The version and prompts stepped past, and a wake-up for waiting workers
        (relayrl.runtime.progress), in one transaction; repeated after a timeout it changes nothing
        but a second wake-up."""
        keys = self.link.keys
        pipe = self.link.r.pipeline(transaction=True)
        pipe.set(keys.trainer_version, self.books.step)
        pipe.set(keys.prompts_finished, self.books.totals["scheduler_prompts_finished"])
        announce_step(pipe, keys, self.books.step)
        pipe.execute()
