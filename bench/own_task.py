"""Your own task, measured: held-out accuracy at the start and after a fixed wall time, for
one or more run configs trained one after the other on this machine.

    python bench/own_task.py                      # own_task.yaml and smollm2_calculator.yaml
    python bench/own_task.py --configs examples/own_task.yaml,examples/own_task_lora.yaml
    python bench/own_task.py --smoke    # the same path on the tiny example, in seconds

Each config runs on the real stack (relayrl up's launcher, every service its own process,
free ports, a fresh run directory under runs/bench_own_task/) with trainer.max_steps lifted,
so the wall time ends the run: once the trainer's `time/elapsed_s` (since it started,
start-up included) passes --minutes, the trainer gets SIGTERM, which saves a checkpoint.
That checkpoint is then evaluated offline on the config's eval sets (as `relayrl eval` does),
which is the "after" figure; the "start" figure is the eval of the starting model (version
0). The evals in between (inline, or the separate evaluator's eval.jsonl, each placed at the
time its version was made) give the curve.

Draws <out>/own_task_<config stems>.png (held-out pass@1 and training reward against
minutes; the results page docs/results/own_task.md shows it) and ends with one JSON line:
per config the start and final pass@1 and their difference in points, steps, samples and
minutes.
"""

from __future__ import annotations

import shutil
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.common import assign_free_ports, evaluate_checkpoint  # noqa: E402
from relayrl.config import RunConfig, load_run_config  # noqa: E402
from relayrl.runtime.metrics import StepRecord, read_records  # noqa: E402
from relayrl_ops.launcher import Launcher  # noqa: E402

DEFAULT_CONFIGS = "examples/own_task.yaml,examples/smollm2_calculator.yaml"
# SmolLM2 on vLLM takes minutes to start, train a step and evaluate on 2 cores; the tiny
# example's model takes the same path (launcher, SIGTERM checkpoint, offline eval) in seconds
SMOKE = {"configs": "examples/tiny_cpu.yaml", "minutes": 0.05,
         "overrides": ["eval.sets=[{name: heldout, max_problems: 16, greedy: false}]"]}


def pass_key(cfg: RunConfig) -> str:
    return f"eval/{cfg.eval.sets[0].name}/pass@1"


def bench_config(path: str, minutes: float, overrides: list[str] = ()) -> RunConfig:
    cfg = load_run_config(path, list(overrides))
    data = cfg.model_dump(mode="json")
    data["run_dir"] = str(ROOT / "runs" / "bench_own_task" / Path(path).stem)
    data["trainer"]["max_steps"] = 1_000_000  # the wall time ends the run
    data["trainer"]["checkpoint"]["every"] = 1_000_000
    assign_free_ports(data)
    return RunConfig.model_validate(data)


def finished_run(cfg: RunConfig, minutes: float) -> tuple[list[StepRecord], Path] | None:
    """A run of `cfg` already in its run directory that trained for `minutes` and left its
    checkpoint (the bench stopped after it, in the offline eval say): its rows and
    checkpoint, as run_for returns them; None if there is none."""
    run_dir = Path(cfg.run_dir)
    steps = [r for r in read_records(run_dir / "metrics.jsonl")
             if r.figures.elapsed_s is not None]
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    if not steps or steps[-1].figures.elapsed_s < minutes * 60 or not checkpoints:
        return None
    return (read_records(run_dir / "metrics.jsonl") + read_records(run_dir / "eval.jsonl"),
            checkpoints[-1])


def run_for(cfg: RunConfig, minutes: float) -> tuple[list[StepRecord], Path]:
    """The run's metrics rows and its final checkpoint after `minutes` of trainer time."""
    run_dir = Path(cfg.run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    metrics = run_dir / "metrics.jsonl"
    launcher = Launcher(cfg, show_trainer_output=False)
    try:
        launcher.start()
        trainer = next(c for c in launcher.children if c.name == "trainer")
        last_report = 0.0
        while True:
            if (code := launcher.supervise()) is not None:
                raise RuntimeError(f"{cfg.run_id} ended early ({code}); see {run_dir}/logs")
            if trainer.budget.used:  # a restarted trainer's clock and versions start over
                raise RuntimeError(f"{cfg.run_id}: the trainer restarted; see {run_dir}/logs")
            rows = [r for r in read_records(metrics) if r.figures.elapsed_s is not None]
            elapsed = rows[-1].figures.elapsed_s if rows else 0.0
            if elapsed >= minutes * 60:
                break
            if time.monotonic() - last_report > 60:
                print(f"  {cfg.run_id}: step {len(rows)}, {elapsed / 60:.1f} of {minutes:g} "
                      "min", flush=True)
                last_report = time.monotonic()
            time.sleep(1.0)
        trainer.proc.send_signal(signal.SIGTERM)  # it checkpoints on the way out
        trainer.proc.wait(timeout=600)
    finally:
        launcher.shutdown()
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    if not checkpoints:
        raise RuntimeError(f"{cfg.run_id}: no checkpoint under {run_dir}/checkpoints")
    return read_records(metrics) + read_records(run_dir / "eval.jsonl"), checkpoints[-1]


def summarize(path: str, cfg: RunConfig, rows: list[StepRecord],
              final: dict[str, float]) -> dict:
    """`rows`: metrics.jsonl and, with eval.mode separate, eval.jsonl; an eval of version v
    is placed at the wall time the trainer made v."""
    key = pass_key(cfg)
    steps = [r for r in rows if r.figures.elapsed_s is not None]
    made_at = {0: 0.0} | {r.step: r.figures.elapsed_s for r in steps}
    evals = sorted({r.step: r.extra[key] for r in rows if key in r.extra}.items())
    start = evals[0][1] if evals and evals[0][0] == 0 else None
    if start is None:
        raise RuntimeError(f"{path}: no eval of the starting model (step 0)")
    wall = steps[-1].figures.elapsed_s
    curve = [(made_at[v] / 60, value) for v, value in evals if v in made_at]
    curve.append((wall / 60, final[key]))
    trained = [r for r in steps if r.figures.samples is not None]  # not batches dropped whole
    samples = sum(r.figures.samples for r in trained)
    return {"config": path, "start_pass@1": round(start, 4), "final_pass@1":
            round(final[key], 4), "gain_points": round(100 * (final[key] - start), 1),
            "steps": len(trained), "samples": samples, "minutes": round(wall / 60, 1),
            "samples_per_s": round(samples / wall, 2), "curve": curve,
            "rewards": [(r.figures.elapsed_s / 60, r.figures.reward_mean) for r in trained],
            "final": final}


def plot(results: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        name = Path(r["config"]).stem
        xs, ys = zip(*r["curve"], strict=True)
        left.plot(xs, ys, marker="o", label=name)
        rx, ry = zip(*r["rewards"], strict=True)
        right.plot(rx, ry, alpha=0.8, label=name)
    left.set(xlabel="minutes", ylabel="held-out pass@1", title="held-out accuracy")
    right.set(xlabel="minutes", ylabel="mean reward", title="training reward")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("own_task", __doc__.splitlines()[0], smoke_help=(
        f"the real path at the smallest size: {SMOKE}, output under runs/own_task_smoke/"))
    parser.add_argument("--configs", help=f"comma-separated (default {DEFAULT_CONFIGS})")
    parser.add_argument("--minutes", type=float, help="wall time of each run (default 30)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results"))
    parser.add_argument("--resume", action="store_true",
                        help="evaluate a config's finished run again instead of rerunning it")
    args = parser.parse_args(argv)
    defaults = SMOKE if args.smoke else {"configs": DEFAULT_CONFIGS, "minutes": 30.0,
                                         "overrides": []}
    if args.smoke:
        args.out = str(ROOT / "runs/own_task_smoke")
    overrides = defaults["overrides"] if args.configs is None else []  # for its own config
    args.configs = args.configs if args.configs is not None else defaults["configs"]
    args.minutes = args.minutes if args.minutes is not None else defaults["minutes"]
    if args.minutes <= 0:
        parser.error(f"--minutes must be > 0, got {args.minutes}")
    results = []
    for path in args.configs.split(","):
        cfg = bench_config(path, args.minutes, overrides)
        done = finished_run(cfg, args.minutes) if args.resume else None
        if done:
            print(f"{path}: the finished run in {cfg.run_dir}", flush=True)
        else:
            print(f"{path}: training for {args.minutes:g} min in {cfg.run_dir}", flush=True)
        rows, checkpoint = done or run_for(cfg, args.minutes)
        final = evaluate_checkpoint(cfg, checkpoint)
        results.append(summarize(path, cfg, rows, final))
        print(f"  start {results[-1]['start_pass@1']:.3f} -> final "
              f"{results[-1]['final_pass@1']:.3f}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # named by its configs, so a run of other configs draws beside it, not over it
    png = out / f"own_task_{'_'.join(Path(c).stem for c in args.configs.split(','))}.png"
    plot(results, png)
    harness.report(args, {"bench": "own_task", "minutes": args.minutes, "runs": [
        {k: v for k, v in r.items() if k not in ("curve", "rewards", "final")}
        for r in results]}, picture=png)


if __name__ == "__main__":
    main()
