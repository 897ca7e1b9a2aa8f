"""How much each cost matters: every cost of the model scaled by 0.5 and by 2 in turn, every
mode run again, and which of the default costs' conclusions still hold.

    relayrl simulate --sensitivity --workers 128        # at the largest fleet size given

Prints one row per (cost, factor): trained samples/s of each mode over sync's, and the
conclusions that hold there; then one JSON line. The costs are those relayrl_sim.costs
cites a source for, grouped as the calibration names them (a decode step's three terms scale
together, and so do a migration's two).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from relayrl_sim.accounting import ModeResult
from relayrl_sim.costs import CostParams
from relayrl_sim.engine import MODES, SimConfig
from relayrl_sim.run import simulate

COSTS: dict[str, tuple[str, ...]] = {
    "decode step": ("decode_fixed_s", "decode_per_seq_s", "decode_per_token_s"),
    "prefill": ("prefill_per_token_s",),
    "training": ("train_fixed_s", "train_per_token_s"),
    "weight sync": ("weight_sync_s",),
    "KV transfer": ("migrate_fixed_s", "migrate_per_token_s"),
}
FACTORS = (0.5, 2.0)
TARGET = 5.5  # the speed-up over sync each sweep checks the best asynchronous mode for


def scaled(costs: CostParams, names: Sequence[str], factor: float) -> CostParams:
    return dataclasses.replace(costs, **{n: getattr(costs, n) * factor for n in names})


def conclusions(by_mode: dict[str, ModeResult], max_staleness: int) -> dict[str, bool]:
    """The claims a sweep supports, each checked where its modes were run."""
    rate = {m: r.trained_samples_per_s for m, r in by_mode.items()}
    out: dict[str, bool] = {}
    if "sync" in rate and "async" in rate:
        out["async > sync"] = rate["async"] > rate["sync"]
    if "async" in rate and "async_repack" in rate:
        out["repack > async"] = rate["async_repack"] > rate["async"]
    asynchronous = [rate[m] for m in ("async", "async_repack") if m in rate]
    if "sync" in rate and asynchronous:
        out["best async >= 2x sync"] = max(asynchronous) >= 2 * rate["sync"]
        out[f"best async >= {TARGET}x sync"] = max(asynchronous) >= TARGET * rate["sync"]
    out["staleness within bound"] = all(r.staleness_max <= max_staleness
                                        for r in by_mode.values())
    return out


def variants(cfg: SimConfig) -> list[tuple[str, float, SimConfig]]:
    """(cost, factor, config): the defaults first, as ("default", 1.0)."""
    rows = [("default", 1.0, cfg)]
    for name, fields in COSTS.items():
        for factor in FACTORS:
            rows.append((name, factor, dataclasses.replace(
                cfg, costs=scaled(cfg.costs, fields, factor))))
    return rows


def run(cfg: SimConfig, workers: int, modes: Sequence[str] = MODES,
        jobs: int = 1) -> list[dict[str, Any]]:
    """Every variant's speedups over sync and conclusions, at `workers` workers."""
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"--modes: {mode!r} is not one of {MODES}")
    if workers < 1:
        raise ValueError(f"--workers: {workers} is not a fleet size (>= 1)")
    rows = variants(cfg)
    grid = [(i, m) for i in range(len(rows)) for m in modes]
    if jobs <= 1:
        results = [simulate(rows[i][2], workers, m) for i, m in grid]
    else:
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(simulate, [rows[i][2] for i, _ in grid],
                                    [workers] * len(grid), [m for _, m in grid]))
    out = []
    for i, (name, factor, variant) in enumerate(rows):
        by_mode = {m: r for (j, m), r in zip(grid, results, strict=True) if j == i}
        sync = by_mode["sync"].trained_samples_per_s if "sync" in by_mode else None
        out.append({
            "cost": name, "factor": factor,
            "trained_samples_per_s": {m: round(r.trained_samples_per_s, 1)
                                      for m, r in by_mode.items()},
            "speedup_vs_sync": ({m: round(r.trained_samples_per_s / sync, 2)
                                 for m, r in by_mode.items()} if sync else {}),
            "conclusions": conclusions(by_mode, variant.max_staleness)})
    return out


def format_table(rows: list[dict[str, Any]]) -> str:
    modes = list(rows[0]["trained_samples_per_s"])
    claims = list(rows[0]["conclusions"])
    head = f"{'cost':<12} {'x':>4} " + " ".join(f"{m:>12}" for m in modes)
    lines = [head + "  conclusions that fail (of: " + "; ".join(claims) + ")",
             "-" * len(head)]
    for row in rows:
        speed = row["speedup_vs_sync"] or row["trained_samples_per_s"]
        failed = [c for c, held in row["conclusions"].items() if not held]
        lines.append(f"{row['cost']:<12} {row['factor']:>4g} "
                     + " ".join(f"{speed[m]:>12.2f}" for m in modes)
                     + "  " + ("; ".join(failed) or "none"))
    lines.append("columns: trained samples/s over sync's (samples/s where sync was not run)")
    return "\n".join(lines)


def surviving(rows: list[dict[str, Any]]) -> dict[str, bool]:
    """Each conclusion of the default costs: whether it holds under every variant."""
    default = rows[0]["conclusions"]
    return {c: all(r["conclusions"].get(c, False) for r in rows)
            for c, held in default.items() if held}


def main(cfg: SimConfig, workers: int, modes: Sequence[str], jobs: int = 1) -> int:
    rows = run(cfg, workers, modes, jobs)
    print(format_table(rows))
    if cfg.migration == "reprefill":
        print("KV transfer: with sim.migration reprefill only migrate_fixed_s applies")
    print(json.dumps({"sensitivity": True, "workers": workers, "rows": rows,
                      "surviving": surviving(rows)}))
    return 0
