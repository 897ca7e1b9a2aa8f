"""The multi-turn tool workload, asynchronous against synchronous: trained samples per second
on the same machine, in the same run of this script.

    python bench/tool_workload.py [--config examples/smollm2_tools.yaml] [--steps 12]

Runs the config twice on the real stack (relayrl up's launcher, every service its own
process): synchronous (trainer.max_staleness 0: every token of a batch from the newest
version, so generation waits for each step and each step for the slowest episode) and as
configured (asynchronous). Episodes are the tool environment's: a heavy-tailed tool latency
and a varying number of calls make them finish at very different times. Reports each run's
trained samples/s over the steps after the first two (start-up left out), the ratio, the
mean lag and the groups dropped as too stale (bounded by max_staleness), and the episodes'
turns (a turn after a tool call is one more turn), and the machine's busy share of CPU in
each. Where generation and training share the cores (one machine), async can only fill what
sync leaves idle: 1 / sync's busy share is the ceiling of the ratio on this machine, and the
ratio is also printed against it. Partial rollouts and repacking do not apply to episodes
(segment_tokens 0). Held-out success before and after a fixed time is bench/own_task.py's:
`python bench/own_task.py --minutes 30 --configs examples/smollm2_tools.yaml`. Ends with one
JSON line (bench/results/tool_workload.jsonl).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.common import (  # noqa: E402
    CpuSampler,
    assign_free_ports,
    run_stack,
    window_figures,
)
from relayrl.config import RunConfig, load_run_config  # noqa: E402

SKIP = 2  # steps of start-up left out of the rates (1 in the smoke run)


def variant(base: RunConfig, run_dir: Path, steps: int, staleness: int | None) -> RunConfig:
    data = base.model_dump(mode="json")
    data.update(run_id=f"tools-{'sync' if staleness == 0 else 'async'}", run_dir=str(run_dir))
    data["trainer"].update(max_steps=steps, progress=False, plot_every=1_000_000)
    data["trainer"]["checkpoint"]["every"] = 1_000_000
    data["eval"]["every"] = 0  # not what is measured
    data["scheduler"]["max_prompts"] = 0
    if staleness is not None:
        data["trainer"]["max_staleness"] = staleness
    assign_free_ports(data)
    return RunConfig.model_validate(data)


def measure(cfg: RunConfig, steps: int, skip: int) -> dict:
    with CpuSampler(Path(cfg.run_dir) / "metrics.jsonl") as cpu:
        rows = run_stack(cfg)
    figures = window_figures(rows, skip, steps)
    trained = [r.figures for r in rows if r.figures.samples]
    return {**{k: round(v, 4) for k, v in figures.items()},
            # the machine's busy share of CPU over the measured steps (None off Linux)
            "cpu_busy": cpu.busy_share(skip, steps),
            "episodes": sum(f.episodes or 0 for f in trained),
            "turns": sum(f.turns or 0 for f in trained),
            "reward_mean": round(sum(f.reward_mean or 0 for f in trained) / max(len(trained), 1),
                                 3)}


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("tool_workload", __doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "examples/smollm2_tools.yaml"))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip", type=int, default=SKIP,
                        help="steps of start-up left out of the rates")
    parser.add_argument("--set", action="append", default=[], dest="overrides",
                        help="a config override, as relayrl up --set takes it")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="relayrl-tools-") as tmp:
        if args.smoke:  # a tiny Llama with SmolLM2's tokenizer plays the episodes in seconds
            args.config, args.steps, args.skip = str(ROOT / "examples/tiny_cpu.yaml"), 2, 1
            args.overrides += [f"model={{kind: hf, path: {smoke_model(Path(tmp))}}}",
                               "rollout.num_workers=1", "scheduler.start_after_workers=1",
                               "buffer.group_size=4",
                               "buffer.groups_per_batch=2",
                               "rollout.segment_tokens=0", "rollout.max_new_tokens=8",
                               "rollout.environment={cls: examples.tools.calc_tools:CalcTools, "
                               "max_turns: 2, options: {tool_timeout_s: 10}}"]
        run(args, Path(tmp))


def smoke_model(tmp: Path) -> Path:
    from relayrl_testkit.families import build_family
    from relayrl_torch.models.smollm2 import ensure_smollm2

    return build_family("llama", tmp / "llama", ensure_smollm2(ROOT / ".cache/relayrl/models"))


def run(args, tmp: Path) -> None:
    base = load_run_config(args.config, args.overrides)
    result = {"bench": "tool_workload", "config": Path(args.config).name, "steps": args.steps,
              "max_staleness": base.trainer.max_staleness}
    for name, staleness in (("sync", 0), ("async", None)):
        cfg = variant(base, tmp / name, args.steps, staleness)
        result[name] = measure(cfg, args.steps, args.skip)
        print(f"{name}: {result[name]['samples_per_s']:.3f} samples/s, lag "
              f"{result[name]['lag_mean']:.2f}, {result[name]['turns']} turns in "
              f"{result[name]['episodes']} episodes", flush=True)
    result["async_over_sync"] = round(result["async"]["samples_per_s"]
                                      / result["sync"]["samples_per_s"], 3)
    print(f"async / sync = {result['async_over_sync']:.2f}", flush=True)
    busy = result["sync"]["cpu_busy"]
    if busy:  # the cores sync leaves idle (waiting on tools and stragglers) are all async gains
        result["ceiling"] = round(1 / busy, 3)
        result["async_over_ceiling"] = round(result["async_over_sync"] / result["ceiling"], 3)
        print(f"ceiling on this machine: {result['ceiling']:.2f} (sync kept the CPU "
              f"{busy:.0%} busy); async reached {result['async_over_ceiling']:.2f} of it",
              flush=True)
    harness.report(args, result)


if __name__ == "__main__":
    main()
