"""Operator control of a live run, as durable signals in Redis.

The scheduler's REST API writes them; the services read them where they act: the scheduler
its own run state (no new leases while paused, no new prompts while stopping), the trainer
the staleness bound, the stop target and the sampling temperature it rescores with, the
buffer whether to flush short batches, the rollout workers the temperature (through their
leases). Living in Redis, they survive a restart of any service, the scheduler's included.
"""

from __future__ import annotations

import json
import logging
import math
from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from relayrl.config.rollout import RolloutConfig
from relayrl.config.services import LiveDefaults
from relayrl.config.trainer import TrainerConfig
from relayrl.contracts.json_types import json_int
from relayrl.contracts.keys import RunKeys

log = logging.getLogger(__name__)

# trainer records kept in Redis for the API's GET /v1/metrics (metrics.jsonl has every one);
# few enough that the list is full within a run's first minutes and Redis stops growing
RECENT_METRICS_KEPT = 200


class RunState(str, Enum):
    RUNNING = "running"
    PAUSED = "paused"  # no lease is handed out; the ones out finish
    STOPPING = "stopping"  # no new prompt; the ones out finish, are trained, the run ends


# The bounds of the config fields the settings start from, so the two cannot disagree;
# strict: an operator's true or "1" is not a number (and NaN is refused, JSON has none).
Staleness = json_int(*TrainerConfig.model_fields["max_staleness"].metadata)
Temperature = Annotated[(float, Strict(),
                         *RolloutConfig.model_fields["temperature"].metadata)]


class LiveSettings(BaseModel):
    """The settings that may change while the run goes on."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    max_staleness: Staleness = Field(
        description="trainer.max_staleness: drop samples whose oldest token lags the trainer "
        "by more versions; also bounds the prompts out at once, unless "
        "scheduler.max_inflight_prompts fixes that.")
    temperature: Temperature = Field(
        description="rollout.temperature: sampling temperature of new leases; the trainer "
        "rescores tokens with it from its next step.")


class SettingsChange(BaseModel):
    """A change of some live settings; a field left out (or null) keeps its value."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    max_staleness: Staleness | None = Field(
        None, description=LiveSettings.model_fields["max_staleness"].description)
    temperature: Temperature | None = Field(
        None, description=LiveSettings.model_fields["temperature"].description)

    def applied_to(self, settings: LiveSettings) -> LiveSettings:
        return settings.model_copy(update=self.model_dump(exclude_none=True))


def configured_settings(defaults: LiveDefaults) -> LiveSettings:
    return LiveSettings(max_staleness=defaults.max_staleness, temperature=defaults.temperature)


def read_settings(redis, keys: RunKeys, defaults: LiveDefaults) -> LiveSettings:
    """The config's values, with whatever an operator changed since."""
    return settings_from_hash(redis.hgetall(keys.live_settings), defaults)


def settings_from_hash(stored: dict | None, defaults: LiveDefaults) -> LiveSettings:
    """The live settings from the raw hash (HGETALL of keys.live_settings), for a caller
    that read it in a pipeline with other keys. A stored value outside today's bounds (kept
    from an older version, or written by hand) keeps the config's value, with an error
    logged once per value: every service reads this hash, and a value that crashed them
    would crash them again at every restart."""
    changed = {k.decode() if isinstance(k, bytes) else k: v for k, v in (stored or {}).items()}
    settings = configured_settings(defaults)
    for name, raw in sorted(changed.items()):
        if name not in LiveSettings.model_fields:
            continue
        try:
            settings = LiveSettings.model_validate(
                {**settings.model_dump(), name: json.loads(raw)})
        except ValueError as err:  # a ValidationError, or JSON that does not parse
            _refuse_stored(name, raw, settings, err)
    return settings


_refused: set[tuple[str, Any]] = set()


def _refuse_stored(name: str, raw: Any, settings: LiveSettings, err: Exception) -> None:
    if (name, raw) in _refused:
        return
    _refused.add((name, raw))
    reason = (err.errors()[0]["msg"] if isinstance(err, ValidationError) else str(err))
    log.error("live setting %s=%r in Redis ignored (%s); using %r until an operator sets it "
              "again (PATCH /v1/settings)", name, raw, reason, getattr(settings, name))


def write_settings(redis, keys: RunKeys, settings: LiveSettings) -> None:
    redis.hset(keys.live_settings,
               mapping={k: json.dumps(v) for k, v in settings.model_dump().items()})


def read_run_state(redis, keys: RunKeys) -> RunState:
    raw = redis.get(keys.run_state)
    if raw is None:
        return RunState.RUNNING
    return RunState(raw.decode() if isinstance(raw, bytes) else raw)


def write_run_state(redis, keys: RunKeys, state: RunState) -> None:
    redis.set(keys.run_state, state.value)


def read_stop_target(redis, keys: RunKeys) -> int | None:
    raw = redis.get(keys.stop_target)
    return None if raw is None else int(raw)


def _finite(value: Any) -> Any:
    # NaN and infinities are not JSON: they travel as null
    return None if isinstance(value, float) and not math.isfinite(value) else value


def push_metrics(redis, keys: RunKeys, record: dict[str, Any], keep: int) -> None:
    """Keep the trainer's `keep` latest metrics records where the control API reads them."""
    pipe = redis.pipeline(transaction=True)
    pipe.lpush(keys.recent_metrics,
               json.dumps({k: _finite(v) for k, v in record.items()}, sort_keys=True))
    pipe.ltrim(keys.recent_metrics, 0, keep - 1)
    pipe.execute()


def read_recent_metrics(redis, keys: RunKeys, last: int) -> list[dict[str, Any]]:
    """The `last` latest records, oldest first."""
    return [json.loads(r) for r in reversed(redis.lrange(keys.recent_metrics, 0, last - 1))]
