"""`relayrl simulate`: every mode at every fleet size, then the table, sim.json and sim.png."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from relayrl.config.base import read_yaml
from relayrl_sim.accounting import ModeResult
from relayrl_sim.costs import load_costs
from relayrl_sim.engine import MODES, SimConfig, config_from_mapping
from relayrl_sim.report import format_table, plot, summary, write_json
from relayrl_sim.run import simulate
from relayrl_sim.workload import RESPONSE_DISTS

DEFAULT_WORKERS = (8, 16, 32, 64, 128, 256, 512, 1024)


def parse_list(text: str, name: str, convert: Callable[[str], Any]) -> list[Any]:
    try:
        items = [convert(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--{name} must be a comma-separated list, got {text!r}") from None
    if not items:
        raise ValueError(f"--{name} is empty")
    return items


def build_config(config: str | None = None, costs: str | None = None, dist: str | None = None,
                 seed: int | None = None, steps: int | None = None,
                 warmup: int | None = None) -> SimConfig:
    """Defaults, then the config file, then the costs file, then the flags."""
    cfg = config_from_mapping(read_yaml(config) if config else {})
    if costs:
        cfg = dataclasses.replace(cfg, costs=load_costs(costs))
    if dist is not None:
        if dist not in RESPONSE_DISTS:
            raise ValueError(f"--dist must be one of {sorted(RESPONSE_DISTS)}, got {dist!r}")
        cfg = dataclasses.replace(
            cfg, workload=dataclasses.replace(cfg.workload, response=RESPONSE_DISTS[dist]))
    if seed is not None:
        cfg = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, seed=seed))
    if steps is not None:
        cfg = dataclasses.replace(cfg, steps=steps, warmup=steps // 2)  # measure the 2nd half
    if warmup is not None:
        cfg = dataclasses.replace(cfg, warmup=warmup)
    return cfg


def check_grid(workers: Sequence[int], modes: Sequence[str]) -> None:
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"--modes: {mode!r} is not one of {MODES}")
    for n in workers:
        if n < 1:
            raise ValueError(f"--workers: {n} is not a fleet size (>= 1)")


def run_grid(cfg: SimConfig, workers: Sequence[int], modes: Sequence[str], jobs: int = 1,
             progress: Callable[[ModeResult], None] = lambda r: None) -> list[ModeResult]:
    """Every (workers, mode), largest first when parallel so the long ones start early."""
    check_grid(workers, modes)
    grid = [(n, m) for n in workers for m in modes]
    results: list[ModeResult] = []
    if jobs <= 1:
        for n, m in grid:
            results.append(simulate(cfg, n, m))
            progress(results[-1])
    else:
        with ProcessPoolExecutor(jobs) as pool:
            futures = [pool.submit(simulate, cfg, n, m)
                       for n, m in sorted(grid, key=lambda g: -g[0])]
            for future in as_completed(futures):
                results.append(future.result())
                progress(results[-1])
    order = {g: i for i, g in enumerate(grid)}
    return sorted(results, key=lambda r: order[(r.workers, r.mode)])


def main(cfg: SimConfig, workers: Sequence[int], modes: Sequence[str], out: str | Path,
         jobs: int | None = None) -> int:
    check_grid(workers, modes)
    jobs = jobs or min(len(workers) * len(modes), os.cpu_count() or 1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    def progress(r: ModeResult) -> None:
        print(f"[{r.workers:>5} workers] {r.mode:<13} {r.trained_samples_per_s:>9.1f} trained/s  "
              f"util {r.utilization:.2f}  ({r.wall_seconds:.1f} s)", flush=True)

    results = run_grid(cfg, workers, modes, jobs, progress)
    print(format_table(results))
    write_json(cfg, results, out / "sim.json")
    plot(results, out / "sim.png",
         title=f"responses: {cfg.workload.response.describe()}; {cfg.steps} trainer steps")
    print(json.dumps(summary(results, json=str(out / "sim.json"), plot=str(out / "sim.png"))))
    return 0
