"""Learning quality: synchronous training against asynchronous training at several staleness
bounds, with and without off-policy correction, over several seeds.

    python bench/convergence.py [--steps N] [--seeds 3] [--staleness 1,2,4,8]
        [--corrections tis_token,none] [--config examples/tiny_cpu.yaml] [--modes GLOBS]
        [--out docs/results] [--smoke]
    python bench/convergence.py --config examples/smollm2_cpu.yaml --staleness 2 --seeds 1 \
        --modes sync,async_2_tis_token     # the headline pair on SmolLM2-135M

Every run is the real stack (relayrl up's launcher, each service its own process) on the
config, with one mode's edits:

- sync: trainer.max_staleness 0 and one batch of prompts in flight
  (scheduler.max_inflight_prompts = buffer.groups_per_batch): generation and training
  alternate, every sample is on-policy.
- async_<k>_<correction>: trainer.max_staleness k and the default in-flight limit
  (max(2, k) batches: relayrl.rules.staleness.inflight_prompts), or async_<k>_in<b>_<correction>
  with b batches in flight (--inflight; b may be a fraction: 2.5 is 20 prompts of 8 a
  batch), which sets the mean lag under the bound; trained with
  trainer.loss.correction <correction> (tis_token: truncated importance sampling, the default;
  none: stale samples trained as if on-policy).

Draws <out>/<name>.png (reward against steps and against wall time, shown on the results
page; name: convergence for the tiny example, else convergence_<config>), writes the table
with its definitions to runs/<name>/<name>.md, keeps each run's directory (metrics, logs)
under runs/<name>/ and
reuses a finished run with the same settings when run again (--fresh reruns it), and ends
with one JSON line: for each asynchronous mode its final reward minus sync's in points and
its wall-time ratio to sync, and whether the target is met (a corrected asynchronous mode
within 2 points of sync's final reward in at most half sync's wall time).
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.common import assign_free_ports, run_stack  # noqa: E402
from bench.convergence_curves import (  # noqa: E402
    RunCurve,
    compare,
    final_mean,
    final_reward,
    points_scale,
    reach_level,
    run_curve,
    seed_mean,
    summarize,
)
from bench.convergence_report import StudySettings, plot_curves, render_markdown  # noqa: E402
from relayrl.config import RunConfig, load_run_config  # noqa: E402
from relayrl.runtime.metrics import read_records  # noqa: E402

# each run starts the whole stack: two runs (sync and one corrected asynchronous mode, so the
# comparison is made) of 2 steps keep the smoke run under a minute on 2 cores
SMOKE = {"steps": 2, "seeds": 1, "staleness": "1", "eval_every": 2,
         "modes": "sync,async_1_tis_token"}
SMOKE_SETS = ["eval.sets=[{name: heldout, max_problems: 32}]", "rollout.num_workers=1",
              "scheduler.start_after_workers=1"]
SEED_STRIDE = 1000  # rollout.seed is offset by worker index: keep seeds' workers apart


@dataclass(frozen=True)
class Mode:
    name: str
    staleness: int
    correction: str
    batches: float = 0  # batches of prompts in flight; 0: the live default for the bound


def study_modes(staleness: list[int], corrections: list[str], sync_correction: str,
                patterns: list[str], inflight: tuple[float, ...] = (0,)) -> list[Mode]:
    modes = [Mode("sync", 0, sync_correction)]
    modes += [Mode(f"async_{k}_{f'in{b:g}_' if b else ''}{c}", k, c, b)
              for k in staleness for b in inflight for c in corrections]
    chosen = [m for m in modes if any(fnmatch.fnmatchcase(m.name, p) for p in patterns)]
    if not chosen:
        raise ValueError(f"--modes: {patterns} match none of {[m.name for m in modes]}")
    return chosen


def mode_config(base: RunConfig, mode: Mode, seed: int, steps: int, eval_every: int | None,
                run_dir: Path) -> RunConfig:
    """The base config with one mode's and one seed's edits (ports are assigned at launch)."""
    data = base.model_dump(mode="json")
    groups = data["buffer"]["groups_per_batch"]
    data.update(run_id=f"convergence-{mode.name}-s{seed}", run_dir=str(run_dir))
    batches = 1 if mode.staleness == 0 else mode.batches
    data["scheduler"]["max_inflight_prompts"] = round(groups * batches)
    data["trainer"]["loss"]["correction"] = mode.correction
    data["trainer"].update(
        max_staleness=mode.staleness, max_steps=steps,
        seed=data["trainer"]["seed"] + seed, checkpoint={"every": steps, "keep": 1},
        plot_every=steps, progress=False)
    if eval_every is not None:
        data["eval"]["every"] = eval_every
    data["rollout"]["seed"] = data["rollout"]["seed"] + SEED_STRIDE * seed
    return RunConfig.model_validate(data)


def run_once(cfg: RunConfig, fresh: bool) -> tuple[RunCurve, bool]:
    """One run's curves, from a finished earlier run with the same settings unless `fresh`;
    True when it was reused. The settings compared leave out the run directory, so a study
    moved or renamed is still reused; a run is made in a sibling `.partial` directory and
    takes the run directory's place only once it has finished, so a killed study keeps every
    run it had finished."""
    run_dir = Path(cfg.run_dir)
    spec = run_spec(cfg)
    rows = read_records(run_dir / "metrics.jsonl")
    finished = sum(r.figures.elapsed_s is not None for r in rows) >= cfg.trainer.max_steps
    if not fresh and finished and saved_spec(run_dir / "bench_spec.json") == spec:
        return run_curve(rows), True
    # a leftover run directory holds a Redis and checkpoints that the trainer would resume
    partial = run_dir.with_name(run_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    data = cfg.model_dump(mode="json")
    data["run_dir"] = str(partial)
    assign_free_ports(data)
    rows = run_stack(RunConfig.model_validate(data))
    shutil.rmtree(partial / "checkpoints", ignore_errors=True)  # GBs for a real model
    (partial / "bench_spec.json").write_text(json.dumps(spec, sort_keys=True))
    shutil.rmtree(run_dir, ignore_errors=True)
    partial.rename(run_dir)
    return run_curve(rows), False


def run_spec(cfg: RunConfig) -> dict:
    """The settings that decide a run's result: its config less where it is written."""
    data = cfg.model_dump(mode="json")
    data.pop("run_dir")
    return data


def saved_spec(path: Path) -> dict | None:
    """The settings a finished run saved, less its run directory (specs saved before the key
    left the directory out still hold it); None when there is none to read."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    data.pop("run_dir", None)
    return data


def study_result(args, summaries, comparisons, scale) -> dict:
    result: dict = {"bench": "convergence", "config": args.config, "steps": args.steps,
                    "seeds": args.seeds, "points_per_reward": scale}
    for s in summaries:
        entry = {"final_reward": round(s.final_reward, 4),
                 "heldout": None if s.heldout is None else round(s.heldout, 4),
                 "reach_s": None if s.reach_s is None else round(s.reach_s, 1),
                 "wall_s": round(s.wall_s, 1), "lag_mean": round(s.lag_mean, 2),
                 "groups_dropped_stale": round(s.groups_dropped_stale, 1)}
        cmp = comparisons.get(s.mode)
        if cmp:
            entry.update(delta_points=round(cmp.delta_points, 2),
                         delta_se_points=round(cmp.delta_se_points, 2),
                         heldout_delta_points=None if cmp.heldout_delta_points is None
                         else round(cmp.heldout_delta_points, 2),
                         learns_as_well=cmp.learns_as_well,
                         heldout_as_well=cmp.heldout_as_well,
                         wall_ratio=None if cmp.wall_ratio is None else round(cmp.wall_ratio, 3),
                         meets_target=cmp.meets_target)
        result[s.mode] = entry
    met = [mode for mode, c in comparisons.items() if c.meets_target]
    result["target_met"] = bool(met)
    result["target_met_by"] = met
    return result


def parse_args(argv=None):
    parser = harness.parser("convergence", __doc__.split("\n\n")[0], smoke_help=(
        f"a tiny schedule: {SMOKE}, output under runs/convergence_smoke/ unless --out is "
        "given"))
    parser.add_argument("--config", default="examples/tiny_cpu.yaml")
    parser.add_argument("--steps", type=int, help="trainer steps per run (default: the "
                        "config's trainer.max_steps)")
    parser.add_argument("--seeds", type=int, help="runs per mode (default 3)")
    parser.add_argument("--staleness", help="asynchronous staleness bounds (default 1,2,4,8)")
    parser.add_argument("--corrections", default="tis_token,none",
                        help="corrections of the asynchronous modes")
    parser.add_argument("--inflight", default="0", help="batches of prompts in flight in the "
                        "asynchronous modes, comma-separated, e.g. 0,2.5 (0, the default: the "
                        "live rule, max(2, k))")
    parser.add_argument("--modes", help="comma-separated names or globs, e.g. "
                        "'sync,async_2_*' (default: all)")
    parser.add_argument("--eval-every", type=int, help="default: the config's")
    parser.add_argument("--smooth", type=float, default=0.05,
                        help="trailing-mean window as a share of the steps")
    parser.add_argument("--out", help="where the PNG goes (default docs/results)")
    parser.add_argument("--name", help="file name of the table (.md) and PNG; default "
                        "convergence for examples/tiny_cpu.yaml, else convergence_<config>, "
                        "so another config's study leaves this one's alone")
    parser.add_argument("--runs-dir", help="run directories (default runs/<name>/)")
    parser.add_argument("--fresh", action="store_true", help="rerun finished runs too")
    args = parser.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
        args.fresh = True  # a reused run would skip the stack the smoke run is there to run
    args.seeds = args.seeds or 3
    args.modes = args.modes or "*"
    args.staleness = [int(k) for k in (args.staleness or "1,2,4,8").split(",")]
    stem = Path(args.config).stem
    args.name = args.name or ("convergence" if stem == "tiny_cpu" else f"convergence_{stem}")
    smoke_root = Path("runs/convergence_smoke")
    args.out = Path(args.out or (smoke_root if args.smoke else "docs/results"))
    args.runs_dir = Path(args.runs_dir or (smoke_root / "runs" if args.smoke
                                           else Path("runs") / args.name)).resolve()
    if args.seeds < 1:
        raise ValueError("--seeds: must be >= 1")
    try:
        args.inflight = tuple(float(b) for b in args.inflight.split(","))
    except ValueError:
        raise ValueError(f"--inflight: numbers of batches, got {args.inflight!r}") from None
    if any(not math.isfinite(b) or 0 < b < 1 or b < 0 for b in args.inflight):
        raise ValueError(f"--inflight: 0 (the live rule) or at least one batch, a trainer "
                         f"batch must fit in flight; got {args.inflight}")
    if min(args.staleness) < 1:
        raise ValueError("--staleness: asynchronous bounds must be >= 1 (sync is staleness 0)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    base = load_run_config(args.config, SMOKE_SETS if args.smoke else [])
    args.steps = args.steps or base.trainer.max_steps
    modes = study_modes(args.staleness, args.corrections.split(","), base.trainer.loss.correction,
                        args.modes.split(","), args.inflight)
    window = max(1, round(args.smooth * args.steps))
    curves_by_mode: dict[Mode, list[RunCurve]] = {}
    for mode in modes:
        for seed in range(args.seeds):
            cfg = mode_config(base, mode, seed, args.steps, args.eval_every,
                              args.runs_dir / f"{mode.name}-s{seed}")
            t0 = time.monotonic()
            run, reused = run_once(cfg, args.fresh)
            curves_by_mode.setdefault(mode, []).append(run)
            print(f"{mode.name:>18} seed {seed}: reward {run.reward[0]:.3f} -> final "
                  f"{final_mean(run.reward):.3f}  lag {run.lag_mean:.2f}  "
                  f"dropped {run.groups_dropped_stale}  {run.samples_per_s:.0f} samples/s  "
                  f"{run.wall_s[-1]:.0f} s trained  "
                  f"({'reused' if reused else f'{time.monotonic() - t0:.0f} s'})", flush=True)

    scale = points_scale([v for runs in curves_by_mode.values() for r in runs for v in r.reward])
    mean_curves = {m: seed_mean(runs, window) for m, runs in curves_by_mode.items()}
    sync = next((m for m in modes if m.staleness == 0), None)
    level = reach_level(final_reward(curves_by_mode[sync])[0], scale) if sync else None
    summaries = [summarize(m.name, m.staleness, m.correction, curves_by_mode[m],
                           mean_curves[m], level) for m in modes]
    comparisons = {}
    if sync is not None:
        sync_summary = summaries[modes.index(sync)]
        comparisons = {s.mode: compare(s, sync_summary, scale) for s in summaries
                       if s.mode != sync.name}

    settings = StudySettings(command=args.command, config=args.config, steps=args.steps,
                             groups_per_batch=base.buffer.groups_per_batch,
                             group_size=base.buffer.group_size, seeds=args.seeds,
                             smooth_window=window, points_scale=scale)
    table, png = args.runs_dir / f"{args.name}.md", args.out / f"{args.name}.png"
    args.out.mkdir(parents=True, exist_ok=True)
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    # the write-up in runs/ shows the picture where it was drawn
    table.write_text(render_markdown(settings, summaries, comparisons,
                                     os.path.relpath(png.resolve(), table.parent.resolve())))
    plot_curves(png, {m.name: c for m, c in mean_curves.items()},
                {m.name: (m.staleness, m.correction) for m in modes}, level,
                f"{args.config}: {args.steps} steps, {args.seeds} seed(s)")
    print(f"wrote {table} and {png}")
    harness.report(args, study_result(args, summaries, comparisons, scale), picture=png)


if __name__ == "__main__":
    main()
