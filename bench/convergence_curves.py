"""The arithmetic of the learning-quality study, free of services: one run's curves from its
metrics rows, smoothing, seed means, the time a curve first reaches a level, and each mode's
summary and its comparison with the synchronous baseline.

Definitions (also written into the report):

- final reward of a run: its mean training reward over the last 10% of its steps; a mode's
  final reward is the mean of its seeds'.
- wall time: seconds since the trainer began its first step, so service start-up and the
  first batch's generation, the same in every mode, are left out.
- a mode's curve: each seed's reward smoothed by a trailing mean (a step only sees steps
  before it, so "reached" never borrows from the future), averaged over seeds step by step;
  its wall-time axis is the seeds' mean wall time at each step.
- a mode reaches sync's final reward when its curve first comes within the tolerance (2
  points) of it; the wall-time ratio is that time over the time sync's own curve first does.
- held-out accuracy of a run: the mean of its last 3 evaluations (sampled), which the
  trainer makes on problems it never trains on; a mode's is the mean of its seeds'.
- a mode learns as well as sync, by either measure, when its seed mean is at most the
  tolerance below sync's; each difference is shown with its standard error.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from relayrl.runtime.metrics import StepRecord

FINAL_FRACTION = 0.1
TOLERANCE_POINTS = 2.0
TARGET_TIME_RATIO = 0.5
HELDOUT_EVALS = 3


@dataclass
class RunCurve:
    """One run, indexed by trainer step 1..n."""

    reward: list[float]  # a step that trained nothing (all groups stale) repeats the last value
    wall_s: list[float]
    evals: list[tuple[int, float]]  # (step, eval/accuracy_sampled), step 0 included
    lag_mean: float
    groups_trained: int
    groups_dropped_stale: int
    samples_trained: int

    @property
    def samples_per_s(self) -> float:
        return self.samples_trained / self.wall_s[-1] if self.wall_s[-1] > 0 else 0.0


def run_curve(rows: list[StepRecord]) -> RunCurve:
    """A run's curves from its metrics.jsonl records (relayrl.runtime.metrics.read_records)."""
    steps = sorted((r for r in rows if r.figures.elapsed_s is not None), key=lambda r: r.step)
    if not steps:
        raise ValueError("metrics: no trainer step recorded")
    figures = [r.figures for r in steps]
    origin = figures[0].elapsed_s - (figures[0].step_s or 0.0)
    lags = [f.lag_mean for f in figures if f.lag_mean is not None]
    return RunCurve(
        reward=fill_gaps([f.reward_mean for f in figures]),
        wall_s=[f.elapsed_s - origin for f in figures],
        evals=sorted((r.step, r.figures.accuracy_sampled) for r in rows
                     if r.figures.accuracy_sampled is not None),
        lag_mean=sum(lags) / len(lags) if lags else 0.0,
        groups_trained=sum(f.groups or 0 for f in figures),
        groups_dropped_stale=sum(f.groups_dropped_stale or 0 for f in figures),
        samples_trained=sum(f.samples or 0 for f in figures),
    )


def fill_gaps(values: list[float | None]) -> list[float]:
    """Missing values take the last one before them (the first one, at the start)."""
    known = [v for v in values if v is not None]
    if not known:
        raise ValueError("metrics: no step has a training reward")
    last = known[0]
    filled = []
    for v in values:
        last = last if v is None else v
        filled.append(last)
    return filled


def trailing_mean(values: list[float], window: int) -> list[float]:
    """Mean of each value and the window - 1 before it (fewer at the start)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def final_mean(values: list[float], fraction: float = FINAL_FRACTION) -> float:
    """Mean over the last `fraction` of the values (at least one)."""
    if not values:
        raise ValueError("final_mean of no values")
    tail = max(1, math.ceil(fraction * len(values)))
    return sum(values[-tail:]) / tail


def first_reach(times: list[float], values: list[float], level: float) -> float | None:
    """The first time at which the curve is at or above `level`; None if it never is."""
    for t, v in zip(times, values, strict=True):
        if v >= level:
            return t
    return None


def points_scale(values: list[float]) -> float:
    """Points per reward unit: 100 for rewards in [0, 1] (a point is a percentage point),
    else 1."""
    return 100.0 if all(0.0 <= v <= 1.0 for v in values) else 1.0


@dataclass
class ModeCurve:
    """A mode's seed-mean smoothed reward, indexed by step."""

    wall_s: list[float]
    reward: list[float]
    reward_std: list[float]  # across seeds; 0 with one seed

    @property
    def steps(self) -> list[int]:
        return list(range(1, len(self.reward) + 1))


def seed_mean(runs: list[RunCurve], window: int) -> ModeCurve:
    """Mean over seeds of each run's smoothed reward and of its wall time, step by step, up
    to the shortest run."""
    if not runs:
        raise ValueError("seed_mean of no runs")
    n = min(len(r.reward) for r in runs)
    smoothed = [trailing_mean(r.reward, window)[:n] for r in runs]
    walls = [r.wall_s[:n] for r in runs]
    by_step = list(zip(*smoothed, strict=True))
    return ModeCurve(wall_s=[statistics.fmean(col) for col in zip(*walls, strict=True)],
                     reward=[statistics.fmean(col) for col in by_step],
                     reward_std=[statistics.pstdev(col) if len(col) > 1 else 0.0
                                 for col in by_step])


@dataclass
class ModeSummary:
    mode: str
    staleness: int
    correction: str
    seeds: int
    final_reward: float  # mean over seeds of each run's final reward
    final_reward_std: float
    final_reward_se: float  # standard error of that mean; 0 with one seed
    wall_s: float  # mean over seeds of the whole run's wall time
    reach_s: float | None  # when the mode's curve first comes within tolerance of sync's final
    samples_per_s: float
    lag_mean: float
    groups_dropped_stale: float  # per run, mean over seeds
    groups_total: float  # trained + dropped stale, per run
    heldout: float | None  # mean over seeds of each run's held-out accuracy
    heldout_se: float


def final_reward(runs: list[RunCurve]) -> tuple[float, float]:
    """Mean and standard deviation over seeds of each run's final reward."""
    finals = [final_mean(r.reward) for r in runs]
    return statistics.fmean(finals), statistics.pstdev(finals) if len(finals) > 1 else 0.0


def standard_error(values: list[float]) -> float:
    """Of the mean of `values`, from their sample standard deviation; 0 for one value."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0


def heldout_accuracy(run: RunCurve, last: int = HELDOUT_EVALS) -> float | None:
    """Mean of the run's last `last` evaluations after step 0; None if it made none."""
    trained = [acc for step, acc in run.evals if step > 0]
    return statistics.fmean(trained[-last:]) if trained else None


def summarize(mode: str, staleness: int, correction: str, runs: list[RunCurve],
              curve: ModeCurve, level: float | None) -> ModeSummary:
    final, spread = final_reward(runs)
    heldouts = [h for h in map(heldout_accuracy, runs) if h is not None]
    return ModeSummary(
        mode=mode, staleness=staleness, correction=correction, seeds=len(runs),
        final_reward=final, final_reward_std=spread,
        final_reward_se=standard_error([final_mean(r.reward) for r in runs]),
        wall_s=statistics.fmean(r.wall_s[-1] for r in runs),
        reach_s=None if level is None else first_reach(curve.wall_s, curve.reward, level),
        samples_per_s=statistics.fmean(r.samples_per_s for r in runs),
        lag_mean=statistics.fmean(r.lag_mean for r in runs),
        groups_dropped_stale=statistics.fmean(r.groups_dropped_stale for r in runs),
        groups_total=statistics.fmean(r.groups_trained + r.groups_dropped_stale for r in runs),
        heldout=statistics.fmean(heldouts) if heldouts else None,
        heldout_se=standard_error(heldouts),
    )


def reach_level(sync_final: float, scale: float,
                tolerance_points: float = TOLERANCE_POINTS) -> float:
    """The reward a curve must reach to count as within tolerance of sync's final reward."""
    return sync_final - tolerance_points / scale


@dataclass
class Comparison:
    """An asynchronous mode against sync."""

    delta_points: float  # final reward minus sync's, in points
    delta_se_points: float  # the standard error of that difference
    wall_ratio: float | None  # its reach time over sync's; None if either never reaches
    meets_target: bool  # corrected, reaches sync's final, in at most half sync's time
    heldout_delta_points: float | None  # held-out accuracy minus sync's, in points
    heldout_se_points: float

    @property
    def learns_as_well(self) -> bool:
        """By final training reward: at most the tolerance below sync."""
        return self.delta_points >= -TOLERANCE_POINTS

    @property
    def heldout_as_well(self) -> bool:
        """By held-out accuracy: at most the tolerance below sync."""
        return (self.heldout_delta_points is not None
                and self.heldout_delta_points >= -TOLERANCE_POINTS)


def compare(mode: ModeSummary, sync: ModeSummary, scale: float,
            time_ratio: float = TARGET_TIME_RATIO) -> Comparison:
    ratio = None
    if mode.reach_s is not None and sync.reach_s:
        ratio = mode.reach_s / sync.reach_s
    both = mode.heldout is not None and sync.heldout is not None
    return Comparison(
        delta_points=(mode.final_reward - sync.final_reward) * scale,
        delta_se_points=math.hypot(mode.final_reward_se, sync.final_reward_se) * scale,
        wall_ratio=ratio,
        meets_target=mode.correction != "none" and ratio is not None and ratio <= time_ratio,
        # held-out accuracy is a share: its points are percentage points whatever the reward
        heldout_delta_points=(mode.heldout - sync.heldout) * 100 if both else None,
        heldout_se_points=math.hypot(mode.heldout_se, sync.heldout_se) * 100)
