"""What a sweep prints and writes: a table, `sim.json`, `sim.png` and a one-line summary.

Speedups are trained samples a second over sync's: a sample the staleness rule drops is no
throughput (relayrl_sim.accounting)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from relayrl_sim.accounting import ModeResult
from relayrl_sim.engine import MODES, SimConfig


def speedups(results: list[ModeResult]) -> dict[tuple[int, str], float]:
    """Trained samples/s over sync's at the same fleet size (absent where sync was not run)."""
    sync = {r.workers: r.trained_samples_per_s for r in results if r.mode == "sync"}
    return {(r.workers, r.mode): r.trained_samples_per_s / sync[r.workers]
            for r in results if r.workers in sync}


def format_table(results: list[ModeResult]) -> str:
    up = speedups(results)
    head = (f"{'workers':>7} {'mode':<13} {'trained/s':>10} {'x sync':>6} {'dropped':>7} "
            f"{'wasted':>6} {'util':>5} {'lag seq':>14} {'lag tok':>14} {'migrations':>10} "
            f"{'migr s':>8} {'trainer idle':>12}")
    lines = [head, "-" * len(head)]
    for r in results:
        speed = f"{up[(r.workers, r.mode)]:6.2f}" if (r.workers, r.mode) in up else f"{'-':>6}"
        lags = [f"{d['mean']:.2f}/{d['p99']:.0f}/{d['max']:.0f}"
                for d in (r.staleness_seq, r.staleness_tok)]
        lines.append(f"{r.workers:>7} {r.mode:<13} {r.trained_samples_per_s:>10.1f} {speed} "
                     f"{r.dropped_share:>7.1%} {r.wasted_share:>6.1%} {r.utilization:>5.2f} "
                     f"{lags[0]:>14} {lags[1]:>14} {r.migrations:>10} {r.migration_s:>8.0f} "
                     f"{r.trainer_idle:>12.2f}")
    lines.append("lag: mean/p99/max versions; dropped: samples dropped as stale; wasted: "
                 "tokens dropped or prefilled again, of trained + wasted")
    return "\n".join(lines)


def to_json(cfg: SimConfig, results: list[ModeResult]) -> dict[str, Any]:
    up = speedups(results)
    return {
        "config": asdict(cfg),
        "utilization": "sequence-seconds decoded / (workers * max_batch * wall time)",
        "speedup_vs_sync": "trained samples/s over sync's at the same fleet size",
        "results": [{**r.as_dict(), "speedup_vs_sync": up.get((r.workers, r.mode))}
                    for r in results],
    }


def write_json(cfg: SimConfig, results: list[ModeResult], path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_json(cfg, results), indent=2) + "\n")


def plot(results: list[ModeResult], path: str | Path, title: str = "") -> None:
    """Throughput, speedup over sync and utilization against fleet size, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    up = speedups(results)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = (("trained samples/s (log)", lambda r: r.trained_samples_per_s),
              ("speedup over sync (trained samples/s)", lambda r: up.get((r.workers, r.mode))),
              ("utilization", lambda r: r.utilization))
    for ax, (label, value) in zip(axes, panels, strict=True):
        for mode in MODES:
            rows = [r for r in results if r.mode == mode and value(r) is not None]
            if rows:
                ax.plot([r.workers for r in rows], [value(r) for r in rows], marker="o",
                        label=mode, color=f"C{MODES.index(mode)}")
        ax.set_xscale("log", base=2)
        sizes = sorted({r.workers for r in results})
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.minorticks_off()
        ax.set_xlabel("generation workers")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[2].set_ylim(0, 1.05)
    axes[0].legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summary(results: list[ModeResult], **extra: Any) -> dict[str, Any]:
    """The closing JSON line: every fleet size's trained samples/s per mode, and the largest
    fleet's speedups, waste, utilization and staleness (max within the bound)."""
    top = max(r.workers for r in results)
    up = speedups(results)
    rows = [r for r in results if r.workers == top]
    per_size: dict[str, dict[str, float]] = {}
    for r in results:
        per_size.setdefault(str(r.workers), {})[r.mode] = round(r.trained_samples_per_s, 1)
    return {
        "workers": top,
        "trained_samples_per_s": per_size,
        "speedup_vs_sync": {r.mode: round(up[(top, r.mode)], 2)
                            for r in rows if (top, r.mode) in up},
        "dropped_share": {r.mode: round(r.dropped_share, 3) for r in rows},
        "wasted_share": {r.mode: round(r.wasted_share, 3) for r in rows},
        "utilization": {r.mode: round(r.utilization, 3) for r in rows},
        "staleness_mean": {r.mode: r.staleness_seq["mean"] for r in rows},
        "staleness_max": {r.mode: r.staleness_max for r in rows},
        **extra,
    }
