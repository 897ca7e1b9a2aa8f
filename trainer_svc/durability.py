"""The trainer's durable state (trainer_svc.trainer.Trainer mixes it in): checkpoint and
resume, the acknowledgement that finishes a checkpoint's batch entries and prompts, and the
trainer version and prompts finished that the scheduler reads.

A batch entry is acknowledged (XACK, XDEL, its prompts marked consumed or dropped) only
once the checkpoint that trained it is on disk, so a restart resumes exactly: the entries
trained since the last checkpoint are read and trained again. Exercised by
tests/integration/test_trainer_resume.py.
"""

from __future__ import annotations

import logging

import torch

from relayrl.contracts import ledger as prompt_ledger
from relayrl.contracts.keys import TRAINER_GROUP
from relayrl.runtime.outage import redis_write
from relayrl.runtime.progress import announce_step
from trainer_svc import checkpoint

log = logging.getLogger(__name__)


class Durability:
    """Methods only: the state (step, totals, ledger, learner, r, keys, ...) is Trainer's."""

    def resume(self) -> None:
        path = checkpoint.latest(self.ckpt_dir)
        if path is None:
            return
        from transformers import AutoModelForCausalLM

        state = checkpoint.load_state(path)
        restored = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.learner.restore(state["extra"].get("objective", {}), restored.state_dict(),
                             state["optimizer"], state.get("optimizer_by_name", False))
        self.step = self.saved_step = state["step"]
        self.totals.update(state["extra"]["totals"])
        self._acknowledge(state["ledger"])  # idempotent if it was already acknowledged
        log.info("resumed from %s at step %d", path, self.step)

    def _acknowledge(self, ledger: checkpoint.Ledger) -> None:
        def write() -> None:
            pipe = self.r.pipeline(transaction=True)
            if ledger.entry_ids:
                pipe.xack(self.keys.batches, TRAINER_GROUP, *ledger.entry_ids)
                pipe.xdel(self.keys.batches, *ledger.entry_ids)
            prompt_ledger.add(pipe, self.keys, "consumed", ledger.consumed)
            prompt_ledger.add(pipe, self.keys, "dropped", ledger.dropped)
            pipe.execute()

        # MULTI/EXEC of XACK, XDEL and SADD: repeating it after a timeout changes nothing
        redis_write(write, self.pressure, "the trainer's acknowledgement", self.stop)

    def save_checkpoint(self) -> None:
        """Write this step's checkpoint, then acknowledge what it trained. One already on disk
        for this step, with nothing read since, is not written again: the loop's periodic
        save at max_steps and the final save would write SmolLM2's 1.6 GB twice, the second
        fsync waiting behind the first's writeback (26 s measured)."""
        if self.saved_step == self.step and self.ledger == checkpoint.Ledger():
            return
        state = self.learner.training_state()
        extra = {"totals": self.totals, "objective": state.objective}
        checkpoint.save(self.ckpt_dir, self.step, self.lm.model, state, self.ledger, extra,
                        self.tc.checkpoint.keep)
        self._acknowledge(self.ledger)
        self.ledger = checkpoint.Ledger()
        self.saved_step = self.step

    def record_progress(self) -> None:
        """The version and prompts stepped past, and a wake-up for waiting workers
        (relayrl.runtime.progress), in one transaction; repeated after a timeout it changes nothing
        but a second wake-up."""
        pipe = self.r.pipeline(transaction=True)
        pipe.set(self.keys.trainer_version, self.step)
        pipe.set(self.keys.prompts_finished, self.totals["scheduler_prompts_finished"])
        announce_step(pipe, self.keys, self.step)
        pipe.execute()
