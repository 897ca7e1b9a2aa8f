"""How `relayrl up` restarts a service process that dies."""

from __future__ import annotations

from pydantic import Field, model_validator

from relayrl.config.base import StrictModel


class RestartConfig(StrictModel):
    max_restarts: int = Field(
        3, ge=0, le=1000,
        description="Times `relayrl up` restarts the relay, scheduler, buffer, trainer or "
        "embedded Redis when it dies (each counted on its own); one more death stops the run. "
        "Rollout workers follow worker_max_restarts.",
    )
    worker_max_restarts: int = Field(
        3, ge=0, le=1000,
        description="Times `relayrl up` restarts a rollout worker that dies (each counted on "
        "its own); its leases lapse and are re-issued meanwhile, and the new process "
        "registers afresh.",
    )
    backoff_s: float = Field(
        0.5, ge=0, le=600,
        description="Wait before the first restart of a service; doubled for each further one.",
    )
    backoff_max_s: float = Field(10.0, ge=0, le=3600, description="Longest wait before a restart.")

    @model_validator(mode="after")
    def _ordered(self) -> RestartConfig:
        if self.backoff_max_s < self.backoff_s:
            raise ValueError(f"restarts.backoff_max_s ({self.backoff_max_s}) must be at least "
                             f"restarts.backoff_s ({self.backoff_s})")
        return self
