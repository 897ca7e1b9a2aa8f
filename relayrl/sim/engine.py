"""The simulation's configuration, its per-step records and what a mode's run amounts to
(the entry point, `simulate`, is relayrl.sim.run).

Every mode writes one `StepRecord` per trainer step. Rates are measured over a window that
leaves out the first `warmup` steps, while the asynchronous pipeline fills up.

Utilization is the fraction of the fleet's sequence slots that were decoding:
sum over decode steps of (step time * sequences in the batch), over
workers * max_batch * wall time. A worker waiting at a barrier, training's turn, loading
weights, prefilling, or decoding a lone straggler counts as (nearly) idle, which is what a
synchronous step's long tail wastes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from relayrl.sim.costs import CostParams, costs_from_mapping
from relayrl.sim.workload import Workload, workload_from_mapping

MODES = ("sync", "one_step_off", "async", "async_repack")


@dataclass(frozen=True)
class SimConfig:
    """max_staleness (async modes): a worker holding version v starts no prompt once the
    trainer is at v + max_staleness, as the prompt would be staler than that when the trainer
    could first take it; prompts out at once are capped at (max_staleness + 1) batches.
    repack_below (async_repack): a draining worker hands its sequences off once fewer than
    this fraction of max_batch remain."""

    workload: Workload = field(default_factory=Workload)
    costs: CostParams = field(default_factory=CostParams)
    steps: int = 28  # trainer steps to simulate
    warmup: int = 20  # steps left out of the rates: about the longest tail's lifetime, after
    # which the asynchronous modes' spread of workers over versions no longer changes
    max_staleness: int = 4
    repack_below: float = 0.75

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"sim.steps must be >= 1, got {self.steps}")
        if not 0 <= self.warmup < self.steps:
            raise ValueError(f"sim.warmup must be in [0, steps), got {self.warmup}")
        if self.max_staleness < 1:
            raise ValueError(f"sim.max_staleness must be >= 1, got {self.max_staleness}")
        if not 0 < self.repack_below <= 1:
            raise ValueError(f"sim.repack_below must be in (0, 1], got {self.repack_below}")


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


@dataclass(frozen=True)
class StepRecord:
    time: float  # when the step's effects are visible (weights out, for the barrier modes)
    samples: int
    tokens: int  # response tokens
    stale_sum: int  # summed over samples
    stale_max: int
    train_s: float
    busy: float  # cumulative sequence-seconds of decoding, whole fleet
    migrations: int  # cumulative sequences migrated
    preemptions: int  # cumulative


START = StepRecord(0.0, 0, 0, 0, 0, 0.0, 0.0, 0, 0)


@dataclass(frozen=True)
class ModeResult:
    mode: str
    workers: int
    samples_per_s: float
    tokens_per_s: float
    utilization: float
    staleness_mean: float
    staleness_max: int
    migrations: int
    preemptions: int
    trainer_idle: float
    sim_seconds: float  # simulated time of the measured window
    wall_seconds: float  # how long simulating it took

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(mode: str, workers: int, cfg: SimConfig, records: list[StepRecord],
              wall_seconds: float) -> ModeResult:
    """Rates over records[warmup] .. records[-1]; records[0] is START."""
    first, last = records[cfg.warmup], records[-1]
    window = records[cfg.warmup + 1:]
    span = last.time - first.time
    samples = sum(r.samples for r in window)
    return ModeResult(
        mode=mode, workers=workers,
        samples_per_s=float(samples / span),
        tokens_per_s=float(sum(r.tokens for r in window) / span),
        utilization=float((last.busy - first.busy) / (workers * cfg.costs.max_batch * span)),
        staleness_mean=float(sum(r.stale_sum for r in window) / samples),
        staleness_max=int(max(r.stale_max for r in window)),
        migrations=last.migrations - first.migrations,
        preemptions=last.preemptions - first.preemptions,
        trainer_idle=float(1.0 - sum(r.train_s for r in window) / span),
        sim_seconds=float(span), wall_seconds=wall_seconds)
