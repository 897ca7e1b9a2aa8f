"""Steady training throughput of a config against variants of it, in one run: how each
overhead cut was measured before and after.

    python bench/throughput.py                                          # the tiny example
    python bench/throughput.py --variant one_group=rollout.max_active_groups=1 \
        --variant two_threads=trainer.torch_threads=2 --rounds 2

Each run is the whole stack (every service its own process, embedded Redis) on free ports,
with evaluation off and no checkpoint inside the window; runs alternate (config, variant,
config, ...), each with the machine to itself. Reported per run, over the steps from --skip
to --steps: samples trained per second, the mean policy-version lag and the groups dropped
as stale; then each variant's median samples/s over the config's (above 1: the variant is
faster), and a JSON line. A variant is NAME=KEY=VALUE[,KEY=VALUE...] (dotted config keys,
values as YAML). The machine is noisy: a few percent either way is noise; repeat.
"""

from __future__ import annotations

import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from bench.common import ROOT, assign_free_ports, run_stack, window_figures  # noqa: E402
from relayrl.config import RunConfig, load_run_config  # noqa: E402


def parse_variant(text: str) -> tuple[str, list[str]]:
    """NAME=KEY=VALUE[,KEY=VALUE...] -> (NAME, ["KEY=VALUE", ...])."""
    name, sep, sets = text.partition("=")
    overrides = [s for s in sets.split(",") if s]
    if not sep or not name or not overrides or any("=" not in s for s in overrides):
        raise ValueError(f"--variant {text!r}: expected NAME=KEY=VALUE[,KEY=VALUE...]")
    if name == "config":
        raise ValueError("--variant: 'config' names the config itself; pick another name")
    return name, overrides


def run_config(path: str, overrides: list[str], steps: int, run_dir: Path) -> RunConfig:
    """A fresh run (an earlier one's checkpoints would be resumed) without eval."""
    shutil.rmtree(run_dir, ignore_errors=True)
    data = load_run_config(path, overrides).model_dump(mode="json")
    data["run_dir"] = str(run_dir)
    data["trainer"].update(max_steps=steps, checkpoint={"every": steps}, progress=False)
    data["eval"]["every"] = 0
    assign_free_ports(data)
    return RunConfig.model_validate(data)


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("throughput", __doc__.splitlines()[0], rounds=1,
                            rounds_help="alternations of the config and its variants",
                            rounds_aliases=("--repeats",))
    parser.add_argument("--config", default="examples/tiny_cpu.yaml")
    parser.add_argument("--variant", action="append", default=[], type=parse_variant)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--skip", type=int, default=100, help="warm-up steps left out")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.skip, args.rounds = 4, 1, 1
    if not 0 < args.skip < args.steps or args.rounds < 1:
        parser.error("need 0 < --skip < --steps and --rounds >= 1")
    work = ROOT / "runs" / ("bench_throughput_smoke" if args.smoke else "bench_throughput")
    runs: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for name, overrides in [("config", []), *args.variant]:
            cfg = run_config(args.config, overrides, args.steps, work / f"{name}_{r}")
            figures = window_figures(run_stack(cfg), args.skip, args.steps)
            runs.setdefault(name, []).append(figures)
            print(f"{name:>14} round {r + 1}: {figures['samples_per_s']:6.1f} samples/s, lag "
                  f"{figures['lag_mean']:.2f}, {figures['groups_dropped_stale']} groups stale",
                  flush=True)
    base = statistics.median(f["samples_per_s"] for f in runs["config"])
    ratios = {name: round(statistics.median(f["samples_per_s"] for f in fs) / base, 3)
              for name, fs in runs.items() if name != "config"}
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}x the config's samples/s")
    harness.report(args, {"bench": "throughput", "config": args.config, "steps": args.steps,
                          "skip": args.skip, "runs": runs, "over_config": ratios})


if __name__ == "__main__":
    main()
