"""The simulation's configuration (the entry point, `simulate`, is relayrl_sim.run; what a
run amounts to is relayrl_sim.accounting).

The rules are the live system's own, and so are their defaults: the staleness bound is
trainer.max_staleness's default, the cap on prompts out at once is the scheduler's
(scheduler.max_inflight_prompts, 0 deriving it from the batch and the bound by
relayrl.rules.staleness.inflight_prompts), and repacking's threshold is scheduler.repack_below's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from relayrl.config.scheduler import SchedulerConfig
from relayrl.config.trainer import TrainerConfig
from relayrl.rules.staleness import inflight_prompts
from relayrl_sim.costs import CostParams, costs_from_mapping
from relayrl_sim.workload import Workload, workload_from_mapping

MODES = ("sync", "one_step_off", "async", "async_repack")
MIGRATIONS = ("reprefill", "kv")
TAILS = ("drain", "preempt")


def live_default(model: Any, name: str) -> Any:
    """A live config field's default, so the simulator keeps no copy of its own."""
    return model.model_fields[name].default


@dataclass(frozen=True)
class SimConfig:
    """max_staleness (trainer.max_staleness): the trainer drops a group whose oldest token
    lags it by more.
    max_start_lag (scheduler.max_start_lag): a worker starts no prompt on weights further
    behind the trainer (the lease's min_version), so it drains and reloads first.
    max_inflight_prompts: prompts out at once (handed out, not yet stepped past by the
    trainer); 0 derives it as the scheduler does.
    repack_below (async_repack): a worker holding at most this share of max_batch hands its
    sequences off when no new prompt can go to it.
    migration: how a moved sequence continues on its target: `reprefill` (vLLM, the live
    repack: its context is prefilled again there) or `kv` (its KV cache is sent over the
    network, costs.migrate_per_token_s a token).
    tails: what a worker does with its running sequences once it may start no new prompt
    (its weights too far behind): `drain` them on its version and reload after (an engine
    holds one version; the live default, rollout.segment_tokens 0), or `preempt` them:
    reload at once and resume them on the new weights, their context prefilled again, as a
    live worker does at a segment boundary (rollout.segment_tokens > 0, rollout.reload
    when_behind; relayrl.rules.staleness.behind decides for both). A preempted
    sequence keeps its oldest token's version, so the drop rule judges it as before; only
    its later tokens are fresher. A worker holding a sequence the rollout's restart rule
    would start over drains instead."""

    workload: Workload = field(default_factory=Workload)
    costs: CostParams = field(default_factory=CostParams)
    steps: int = 28  # trainer steps to simulate
    warmup: int = 20  # steps left out of the rates: about the longest tail's lifetime, after
    # which the asynchronous modes' spread of workers over versions no longer changes
    max_staleness: int = live_default(TrainerConfig, "max_staleness")
    max_inflight_prompts: int = live_default(SchedulerConfig, "max_inflight_prompts")
    repack_below: float = live_default(SchedulerConfig, "repack_below")
    max_start_lag: int = live_default(SchedulerConfig, "max_start_lag")
    migration: str = "reprefill"
    tails: str = "drain"

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"sim.steps must be >= 1, got {self.steps}")
        if not 0 <= self.warmup < self.steps:
            raise ValueError(f"sim.warmup must be in [0, steps), got {self.warmup}")
        if self.max_staleness < 0:
            raise ValueError(f"sim.max_staleness must be >= 0, got {self.max_staleness}")
        if self.max_start_lag < 0:
            raise ValueError(f"sim.max_start_lag must be >= 0, got {self.max_start_lag}")
        if self.max_inflight_prompts < 0:
            raise ValueError(f"sim.max_inflight_prompts must be >= 0, "
                             f"got {self.max_inflight_prompts}")
        if not 0 < self.repack_below <= 1:
            raise ValueError(f"sim.repack_below must be in (0, 1], got {self.repack_below}")
        if self.migration not in MIGRATIONS:
            raise ValueError(f"sim.migration must be one of {MIGRATIONS}, got "
                             f"{self.migration!r}")
        if self.tails not in TAILS:
            raise ValueError(f"sim.tails must be one of {TAILS}, got {self.tails!r}")

    def inflight_limit(self, groups_per_batch: int) -> int:
        """As RunConfig.inflight_limit: the configured cap, or the scheduler's derived one."""
        return self.max_inflight_prompts or inflight_prompts(groups_per_batch,
                                                             self.max_staleness)


def config_from_mapping(data: Mapping[str, Any]) -> SimConfig:
    """A config file's `workload:`, `costs:` and `sim:` sections."""
    for key in data:
        if key not in ("workload", "costs", "sim"):
            raise ValueError(f"{key} is not a section (known: workload, costs, sim)")
    sim = dict(data.get("sim") or {})
    known = {f.name for f in fields(SimConfig)} - {"workload", "costs"}
    for key in sim:
        if key not in known:
            raise ValueError(f"sim.{key} is not a simulation field (known: {sorted(known)})")
    return SimConfig(workload=workload_from_mapping(data.get("workload") or {}),
                     costs=costs_from_mapping(data.get("costs") or {}), **sim)
