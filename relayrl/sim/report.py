"""What a sweep prints and writes: a table, `sim.json`, `sim.png` and a one-line summary."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from relayrl.sim.engine import MODES, ModeResult, SimConfig


def speedups(results: list[ModeResult]) -> dict[tuple[int, str], float]:
    """Tokens/s over sync's at the same fleet size (absent where sync was not run)."""
    sync = {r.workers: r.tokens_per_s for r in results if r.mode == "sync"}
    return {(r.workers, r.mode): r.tokens_per_s / sync[r.workers]
            for r in results if r.workers in sync}


def format_table(results: list[ModeResult]) -> str:
    up = speedups(results)
    head = (f"{'workers':>7} {'mode':<13} {'samples/s':>10} {'tokens/s':>11} {'x sync':>6} "
            f"{'util':>5} {'stale':>5} {'max':>3} {'migrations':>10} {'trainer idle':>12}")
    lines = [head, "-" * len(head)]
    for r in results:
        speed = f"{up[(r.workers, r.mode)]:6.2f}" if (r.workers, r.mode) in up else f"{'-':>6}"
        lines.append(f"{r.workers:>7} {r.mode:<13} {r.samples_per_s:>10.1f} "
                     f"{r.tokens_per_s:>11.0f} {speed} {r.utilization:>5.2f} "
                     f"{r.staleness_mean:>5.2f} {r.staleness_max:>3} {r.migrations:>10} "
                     f"{r.trainer_idle:>12.2f}")
    return "\n".join(lines)


def to_json(cfg: SimConfig, results: list[ModeResult]) -> dict[str, Any]:
    up = speedups(results)
    return {
        "config": asdict(cfg),
        "utilization": "sequence-seconds decoded / (workers * max_batch * wall time)",
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
    panels = (("tokens/s (log)", lambda r: r.tokens_per_s),
              ("speedup over sync (tokens/s)", lambda r: up.get((r.workers, r.mode))),
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
    """The largest fleet's speedups and utilizations, for the closing JSON line."""
    top = max(r.workers for r in results)
    up = speedups(results)
    rows = [r for r in results if r.workers == top]
    return {
        "workers": top,
        "speedup_vs_sync": {r.mode: round(up[(top, r.mode)], 2)
                            for r in rows if (top, r.mode) in up},
        "utilization": {r.mode: round(r.utilization, 3) for r in rows},
        "staleness_mean": {r.mode: round(r.staleness_mean, 2) for r in rows},
        **extra,
    }
