"""Peak memory of every service of a real run, against what `relayrl check` plans for it.

    python bench/memory.py [--config examples/smollm2_cpu.yaml] [--steps 6] [--sample-s 0.5]

Runs the config's stack (relayrl up's launcher, every service its own process, embedded
Redis) for `--steps` trainer steps and samples each service's resident memory (RSS, its
child processes included: vLLM's engine core runs in one) every `--sample-s` seconds. Prints
each service's peak beside the weights and caches `relayrl check` plans for it, and the
stack's peak (the largest sum of one sampling) as a ratio to TARGET_GIB. Ends with one JSON
line (bench/results/memory.jsonl).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.common import assign_free_ports  # noqa: E402
from bench.soak import _last_step, redis_pid  # noqa: E402
from relayrl.config import RunConfig, load_run_config  # noqa: E402
from relayrl_ops.launcher import Launcher  # noqa: E402

TARGET_GIB = 5.0  # the whole stack of the SmolLM2 example, float32
MIB = 2**20


def tree_rss(pid: int) -> int | None:
    """Resident memory of `pid` and its descendants, or None once it has gone."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def service(name: str) -> str:
    """A launcher child's service: rollout-0 and rollout-1 are both the rollout worker."""
    return name.rstrip("0123456789").rstrip("-_") or name


def measured_config(base: RunConfig, run_dir: Path, steps: int) -> RunConfig:
    data = base.model_dump(mode="json")
    data.update(run_id="memory", run_dir=str(run_dir))
    data["trainer"].update(max_steps=steps, progress=False, plot_every=1_000_000)
    data["trainer"]["checkpoint"]["every"] = steps  # one checkpoint, as a run writes them
    data["scheduler"]["max_prompts"] = 0
    data["eval"]["every"] = 0  # the evaluator's memory is the trainer's, inline
    assign_free_ports(data)
    return RunConfig.model_validate(data)


def planned(cfg: RunConfig) -> dict[str, float]:
    """MiB per process that `relayrl check` plans (weights and caches only), for the model
    the run prepared."""
    from relayrl.config import HfModel, PretrainedModel
    from relayrl.models.cache import tiny_model_dir
    from relayrl_ops.check import planned_memory

    m = cfg.model
    where = (Path(m.path) if isinstance(m, HfModel) else m.converted_dir
             if isinstance(m, PretrainedModel) else tiny_model_dir(m, cfg.task))
    plan = planned_memory(cfg, where) or []
    names = {"rollout worker": "rollout"}
    return {names.get(name, name): round(sum(b for _, b in parts) / MIB, 1)
            for name, _, parts in plan}


def measure(cfg: RunConfig, sample_s: float, timeout_s: float) -> tuple[dict, float, int]:
    """(peak MiB per process, peak MiB of the stack, steps reached)."""
    launcher = Launcher(cfg, show_trainer_output=False)
    peaks: dict[str, int] = {}
    stack_peak = 0
    try:
        launcher.start()
        pids = {c.name: c.proc.pid for c in launcher.children}
        pids["redis"] = redis_pid(launcher.cfg)
        deadline = time.monotonic() + timeout_s
        while launcher.supervise() is None and time.monotonic() < deadline:
            total = 0
            for name, pid in pids.items():
                if (rss := tree_rss(pid)) is not None:
                    peaks[name] = max(peaks.get(name, 0), rss)
                    total += rss
            stack_peak = max(stack_peak, total)
            time.sleep(sample_s)
    finally:
        launcher.shutdown()
    return ({k: round(v / MIB, 1) for k, v in sorted(peaks.items())}, round(stack_peak / MIB, 1),
            _last_step(Path(cfg.run_dir) / "metrics.jsonl"))


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("memory", __doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "examples/smollm2_cpu.yaml"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--sample-s", type=float, default=0.5)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    args = parser.parse_args(argv)
    if args.smoke:
        args.config, args.steps, args.sample_s = str(ROOT / "examples/tiny_cpu.yaml"), 2, 0.2
    with tempfile.TemporaryDirectory(prefix="relayrl-memory-") as tmp:
        cfg = measured_config(load_run_config(args.config), Path(tmp) / "run", args.steps)
        peaks, stack, steps = measure(cfg, args.sample_s, args.timeout_s)
        plan = planned(cfg)
    for name, mib in peaks.items():
        print(f"{name:<14} peak {mib:8.0f} MiB   planned weights and caches "
              f"{plan.get(service(name), 0):8.0f} MiB", flush=True)
    print(f"stack peak {stack / 1024:.2f} GiB = {stack / 1024 / TARGET_GIB:.2f} of the "
          f"{TARGET_GIB:g} GiB target", flush=True)
    harness.report(args, {"bench": "memory", "config": Path(args.config).name,
                          "steps": steps, "peak_mib": peaks, "planned_mib": plan,
                          "stack_peak_gib": round(stack / 1024, 2),
                          "target_gib": TARGET_GIB,
                          "ratio_to_target": round(stack / 1024 / TARGET_GIB, 3)})


if __name__ == "__main__":
    main()
