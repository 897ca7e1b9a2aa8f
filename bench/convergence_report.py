"""The learning-quality study's outputs: a markdown table and a PNG of the reward curves."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.convergence_curves import (
    FINAL_FRACTION,
    HELDOUT_EVALS,
    TARGET_TIME_RATIO,
    TOLERANCE_POINTS,
    Comparison,
    ModeCurve,
    ModeSummary,
)


@dataclass
class StudySettings:
    command: str
    config: str
    steps: int
    groups_per_batch: int
    group_size: int
    seeds: int
    smooth_window: int
    points_scale: float


def _reward(value: float, spread: float, seeds: int) -> str:
    return f"{value:.3f} ± {spread:.3f}" if seeds > 1 else f"{value:.3f}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "never"
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


def _delta(points: float | None, se: float) -> str:
    if points is None:
        return "–"
    return f"{points:+.1f} ± {se:.1f}" if se else f"{points:+.1f}"


def _dropped(summary: ModeSummary) -> str:
    share = summary.groups_dropped_stale / summary.groups_total if summary.groups_total else 0.0
    return f"{summary.groups_dropped_stale:.1f} of {summary.groups_total:.0f} ({share:.1%})"


def table_rows(summaries: list[ModeSummary], comparisons: dict[str, Comparison]) -> list[str]:
    header = ("| mode | staleness | correction | final reward | vs sync (points) "
              "| held-out accuracy | vs sync (points) "
              "| reaches sync's final at | wall-time ratio | run wall time | samples/s "
              "| mean lag | groups dropped stale (per run) |")
    rows = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for s in summaries:
        cmp = comparisons.get(s.mode)
        ratio = f"{cmp.wall_ratio:.2f}" if cmp and cmp.wall_ratio is not None else "–"
        if cmp and cmp.meets_target:
            ratio = f"**{ratio}**"
        accuracy = "–" if s.heldout is None else f"{s.heldout:.3f}"
        rows.append(
            f"| {s.mode} | {s.staleness} | {s.correction} "
            f"| {_reward(s.final_reward, s.final_reward_std, s.seeds)} "
            f"| {_delta(cmp.delta_points, cmp.delta_se_points) if cmp else '–'} "
            f"| {accuracy} "
            f"| {_delta(cmp.heldout_delta_points, cmp.heldout_se_points) if cmp else '–'} "
            f"| {_seconds(s.reach_s)} | {ratio} | {_seconds(s.wall_s)} | {s.samples_per_s:.1f} "
            f"| {s.lag_mean:.2f} | {_dropped(s)} |")
    return rows


def _learning_verdict(summaries: list[ModeSummary], comparisons: dict[str, Comparison]) -> str:
    corrected = {s.mode: comparisons[s.mode] for s in summaries
                 if s.mode in comparisons and s.correction != "none"}
    by_reward = [m for m, c in corrected.items() if c.learns_as_well] or ["none"]
    by_heldout = [m for m, c in corrected.items() if c.heldout_as_well] or ["none"]
    return (f"Learning as well as sync (a seed mean at most {TOLERANCE_POINTS:g} points "
            f"below sync's), corrected modes: by final training reward, "
            f"{', '.join(by_reward)}; by held-out accuracy, {', '.join(by_heldout)}.")


def render_markdown(settings: StudySettings, summaries: list[ModeSummary],
                    comparisons: dict[str, Comparison], png_name: str) -> str:
    met = [mode for mode, c in comparisons.items() if c.meets_target]
    if not comparisons:
        verdict = "Not judged: the study had no sync run or no asynchronous run."
    elif met:
        verdict = f"**Met** by {', '.join(met)}."
    else:
        verdict = "**Not met** by any corrected asynchronous mode."
    points = "percentage points" if settings.points_scale == 100 else "reward units"
    lines = [
        "# Learning quality: synchronous against asynchronous training",
        "",
        f"Written by `{settings.command}`; rerun it rather than editing this file.",
        "",
        f"Config `{settings.config}`: {settings.steps} trainer steps of "
        f"{settings.groups_per_batch} prompts x {settings.group_size} samples, "
        f"{settings.seeds} seed(s) per mode. sync trains with a staleness bound of 0 and one "
        "batch of prompts in flight, so generation and training alternate; async_k allows "
        "k versions of lag and max(2, k) batches in flight (async_k_in<b>: b batches, which "
        "sets the mean lag under the bound), with the configured off-policy correction or "
        "with none. Seeds vary trainer.seed and rollout.seed; the task seed "
        "stays, since it fixes the held-out split and the warm-started model every mode "
        "starts from.",
        "",
        f"Target: a corrected asynchronous mode comes within {TOLERANCE_POINTS:g} points of "
        f"sync's final reward in at most {TARGET_TIME_RATIO:g} of the wall time sync takes "
        f"to get there. {verdict}",
        "",
        _learning_verdict(summaries, comparisons) if comparisons else "",
        "",
        *table_rows(summaries, comparisons),
        "",
        f"- final reward: mean training reward over the last {FINAL_FRACTION:.0%} of a run's "
        "steps, mean ± standard deviation over seeds.",
        f"- points: {points} of reward; held-out accuracy in percentage points; each "
        "difference from sync ± its standard error (from the seeds' spread).",
        "- wall time: seconds since the trainer began its first step (service start-up and "
        "the first batch's generation are left out: they are the same in every mode).",
        f"- reaches sync's final at: the first wall time at which the mode's curve (each "
        f"seed's reward as a trailing mean over {settings.smooth_window} steps, averaged over "
        "seeds step by step, against the seeds' mean wall time at that step) is within "
        f"{TOLERANCE_POINTS:g} points of sync's final reward; a trailing mean never looks "
        "ahead, so a curve is not credited with a level before it gets there.",
        "- wall-time ratio: that time over the time sync's own curve gets there.",
        "- mean lag: policy versions between the sampling weights and the trained ones, mean "
        "over steps; groups dropped stale: groups over the staleness bound, never trained on.",
        f"- held-out accuracy: the mean of a run's last {HELDOUT_EVALS} evaluations (sampled, "
        "on problems never trained on), mean over seeds.",
        "",
        f"![reward against steps and wall time]({png_name})",
        "",
    ]
    return "\n".join(lines)


def _style(staleness: int, correction: str, order: int) -> dict:
    if staleness == 0:
        return {"color": "black", "linestyle": "-", "linewidth": 2.0}
    import matplotlib

    color = matplotlib.colormaps["viridis"](0.15 + 0.7 * order)
    return {"color": color, "linestyle": "--" if correction == "none" else "-",
            "linewidth": 1.3}


def plot_curves(path: Path, curves: dict[str, ModeCurve], modes: dict[str, tuple[int, str]],
                level: float | None, title: str) -> None:
    """Reward against steps and against wall time: a line per mode (seed mean), a band of
    one standard deviation across seeds, and the level that counts as reaching sync."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stalenesses = sorted({k for k, _ in modes.values() if k > 0})
    order = {k: i / max(1, len(stalenesses) - 1) for i, k in enumerate(stalenesses)}
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for name, curve in curves.items():
        staleness, correction = modes[name]
        style = _style(staleness, correction, order.get(staleness, 0.0))
        low = [m - s for m, s in zip(curve.reward, curve.reward_std, strict=True)]
        high = [m + s for m, s in zip(curve.reward, curve.reward_std, strict=True)]
        for ax, xs in ((by_step, curve.steps), (by_time, curve.wall_s)):
            ax.plot(xs, curve.reward, label=name, **style)
            ax.fill_between(xs, low, high, color=style["color"], alpha=0.12, linewidth=0)
    for ax in (by_step, by_time):
        if level is not None:
            ax.axhline(level, color="grey", linewidth=0.8, linestyle=":",
                       label=f"sync final - {TOLERANCE_POINTS:g} points")
        ax.grid(alpha=0.3)
    by_step.set_xlabel("trainer step")
    by_time.set_xlabel("wall time since the first step (s)")
    by_step.set_ylabel("training reward (trailing mean, seed mean)")
    by_time.legend(loc="lower right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
