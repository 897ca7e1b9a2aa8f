"""Redis key names of a run, in one place so every service agrees on them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunKeys:
    run_id: str

    def _k(self, name: str) -> str:
        return f"relayrl:{self.run_id}:{name}"

    @property
    def trajectories(self) -> str:
        return self._k("trajectories")

    @property
    def batches(self) -> str:
        return self._k("batches")

    @property
    def trainer_version(self) -> str:
        return self._k("trainer:version")

    def ledger(self, name: str) -> str:
        """Sets of prompt ids: leased, failed, batched, consumed, dropped."""
        assert name in LEDGER_SETS, name
        return self._k(f"ledger:{name}")


LEDGER_SETS = ("leased", "failed", "batched", "consumed", "dropped")
BUFFER_GROUP = "buffer"
TRAINER_GROUP = "trainer"
