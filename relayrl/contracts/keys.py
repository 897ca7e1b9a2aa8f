"""Redis key names of a run, in one place so every service agrees on them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunKeys:
    run_id: str

    @property
    def prefix(self) -> str:
        """What every key of the run starts with (the shipped Redis ACL user's key pattern)."""
        return f"relayrl:{self.run_id}:"

    def _k(self, name: str) -> str:
        return self.prefix + name

    @property
    def trajectories(self) -> str:
        return self._k("trajectories")

    @property
    def batches(self) -> str:
        return self._k("batches")

    @property
    def trainer_version(self) -> str:
        return self._k("trainer:version")

    @property
    def trainer_steps(self) -> str:
        """Stream of one small entry per trainer step (relayrl.runtime.progress): what wakes workers
        waiting for room under the scheduler's in-flight cap."""
        return self._k("trainer:steps")

    @property
    def prompts_finished(self) -> str:
        """Scheduler prompts the trainer has stepped past (trained or dropped as stale), as of
        its latest step; what frees room under the scheduler's in-flight cap."""
        return self._k("trainer:prompts_finished")

    @property
    def tokens_generated(self) -> str:
        """Hash of worker id -> tokens its training loop has generated (a throughput figure
        the trainer records every step; not part of the ledger)."""
        return self._k("rollout:tokens_generated")

    @property
    def external_ids(self) -> str:
        """Counter of prompt ids given to externally submitted groups."""
        return self._k("buffer:external_ids")

    def submit_request(self, request_id: str) -> str:
        """The prompt id (and request digest) Submit gave a client's request_id, kept for
        buffer.submit_dedup_ttl_s so that a retried Submit appends nothing."""
        return self._k(f"buffer:submit:{request_id}")

    @property
    def partials(self) -> str:
        """Hash of prompt id -> saved PartialGroup of prompts being generated in segments."""
        return self._k("scheduler:partials")

    @property
    def run_state(self) -> str:
        """The operator's word on the run: running, paused or stopping
        (relayrl.contracts.control)."""
        return self._k("control:state")

    @property
    def live_settings(self) -> str:
        """Hash of the settings an operator changed during the run (relayrl.contracts.control)."""
        return self._k("control:settings")

    @property
    def stop_target(self) -> str:
        """Set once a stopping run has nothing left out: the scheduler prompts the trainer
        must have finished before it writes its last checkpoint and exits."""
        return self._k("control:stop_target")

    @property
    def quarantine(self) -> str:
        """Stream of the newest quarantine records with their batch entries' payloads
        (entry, record, payload), capped (trainer_svc.quarantine)."""
        return self._k("trainer:quarantine")

    @property
    def quarantine_index(self) -> str:
        """Hash of "batch entry id:kind" -> JSON record (reason, prompt ids, step) of every
        batch entry the trainer quarantined groups of or skipped a step on; `relayrl audit`
        reports it."""
        return self._k("trainer:quarantine:index")

    @property
    def recent_metrics(self) -> str:
        """List of the trainer's latest metrics records (JSON), newest first, capped."""
        return self._k("trainer:recent_metrics")

    def ledger(self, name: str) -> str:
        """Bitmap of the scheduler prompt ids in ledger `name` (relayrl.contracts.ledger)."""
        assert name in LEDGER_SETS, name
        return self._k(f"ledger:{name}")

    def ledger_external(self, name: str) -> str:
        """Set of the external prompt ids in ledger `name` (relayrl.contracts.ledger)."""
        assert name in LEDGER_SETS, name
        return self._k(f"ledger:{name}:external")


LEDGER_SETS = ("leased", "failed", "batched", "consumed", "dropped")
# Groups submitted from outside the scheduler (custom rollouts) get prompt ids from here up,
# so they never collide with the scheduler's and the books of both stay separate.
EXTERNAL_PROMPT_BASE = 1 << 40


def is_external(prompt_id: int) -> bool:
    return prompt_id >= EXTERNAL_PROMPT_BASE
BUFFER_GROUP = "buffer"
TRAINER_GROUP = "trainer"
