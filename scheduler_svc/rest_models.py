"""Request and response models of the scheduler's REST control API (scheduler_svc.rest)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from relayrl.contracts.control import LiveSettings, RunState


class RequestBody(BaseModel):
    """A request body: no unknown fields, no coercion (true is not 1, "1" is not 1), no
    NaN or infinities."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ErrorView(BaseModel):
    detail: str = Field(description="What was wrong, naming the field or the state.")


def refusals(*codes: int) -> dict:
    """OpenAPI `responses` for the refusals a route may answer with."""
    text = {400: "a body that is not JSON", 401: "missing or wrong bearer token",
            404: "no such worker",
            409: "not allowed in the run's present state or config"}
    return {c: {"model": ErrorView, "description": text[c]} for c in codes}


class WorkerView(BaseModel):
    worker_id: str
    policy_version: int = Field(description="Version the worker last reported running.")
    last_seen_s_ago: float = Field(description="Seconds since its last heartbeat or request.")
    active_leases: int
    draining: bool = Field(description="True: it is given no new leases.")


class LeaseView(BaseModel):
    lease_id: str
    prompt_id: int
    worker_id: str
    attempt: int = Field(description="1 for the prompt's first lease, 2 for its first re-issue...")
    expires_in_s: float = Field(description="Seconds until it lapses unless renewed.")
    has_saved_tokens: bool = Field(description="Partial rollout state is held for its prompt.")
    unfinished_sequences: int | None = Field(
        description="Sequences still generating at the last saved segment; null before one.")
    recalled_to: str | None = Field(
        description="A repack moves it to this worker at the holder's next segment boundary.")


class RepackRequest(RequestBody):
    force: bool = Field(
        True, description="Plan even while new prompts wait to be handed out (the automatic "
        "repack waits until none do, since idle seats then fill with new prompts).")


class MoveView(BaseModel):
    lease_id: str
    sequences: int = Field(description="Unfinished sequences it carries.")
    from_worker: str
    to_worker: str


class DrainRequest(RequestBody):
    lapse_leases: bool = Field(
        False, description="Also take the worker's current leases back now (they are re-issued "
        "to others, with any saved token state); otherwise they finish where they are.")


class BufferDepth(BaseModel):
    samples_waiting: int = Field(
        description="Samples on the trajectory stream not yet assembled into batches.")
    batches_waiting: int = Field(description="Batches the trainer has not read yet.")


class RunStatusView(BaseModel):
    state: RunState = Field(description="running, paused or stopping.")
    trainer_step: int = Field(description="Optimizer steps taken (= the newest policy version).")
    worker_versions: dict[str, int] = Field(
        description="Policy version each registered worker last reported running.")
    buffer: BufferDepth
    reward_mean: float | None = Field(
        description="Mean reward of the trainer's latest step; null before the first.")
    samples_per_s: float | None = Field(
        description="Samples trained per second over the trainer's last 30 s.")
    tokens_per_s: float | None = Field(
        description="Response tokens trained per second over the trainer's last 30 s.")
    settings: LiveSettings
    stop_target: int | None = Field(
        description="Stopping, with nothing left out: the prompts the trainer must have "
        "finished before it checkpoints and exits; null otherwise.")


class RunStateView(BaseModel):
    state: RunState


MetricsRecord = dict[str, Any]


class StatusView(BaseModel):
    """The lease counters (as before) and the run's figures under `run`."""

    handed_out: int
    inflight: int
    finished: int
    failed: int
    leases_granted: int
    leases_completed: int
    leases_expired: int
    leases_released: int
    leases_recalled: int
    leases_moved: int
    done: bool
    run: RunStatusView
