"""The whole stack on one GPU: the tiny example with the trainer and both rollout workers on
CUDA, for a few steps, reported as one JSON line.

    python bench/gpu_smoke.py                 # examples/tiny_cpu.yaml, 20 steps, on cuda
    python bench/gpu_smoke.py --steps 50 --skip 5
    python bench/gpu_smoke.py --config examples/smollm2_cpu.yaml --set rollout.engine=torch

Every service is its own process (relayrl up's launcher) on free ports, evaluation off, with
trainer.device=cuda and, for the torch engine, rollout.engine.device=cuda (precision left at
auto: bf16 where the GPU supports it). Reported over the steps after --skip (the first ones
pay CUDA's start-up):
the mean step time (time/step_s), the weight publish's seconds (weights/publish_stall_s:
training held; publish_copy_s: the device-to-host snapshot; publish_send_s: to the relay),
generated tokens per second (throughput/generated_tokens_per_s at the last step, a 30 s
window), and the engine/trainer log-probability gap (rollout/engine_logp_absdiff, mean and
max over the steps that have it). The trainer's and workers' devices are read back from their
logs. On a machine without CUDA it exits with status 2 and says so.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from bench.common import ROOT, run_stack  # noqa: E402
from bench.throughput import run_config  # noqa: E402
from relayrl.config import TorchEngineConfig  # noqa: E402
from relayrl.runtime.metrics import StepFigures, StepRecord  # noqa: E402


def mean_of(rows: list[StepFigures], name: str) -> float | None:
    values = [getattr(r, name) for r in rows if getattr(r, name) is not None]
    return round(statistics.fmean(values), 6) if values else None


def max_of(rows: list[StepFigures], name: str) -> float | None:
    values = [getattr(r, name) for r in rows if getattr(r, name) is not None]
    return round(max(values), 6) if values else None


def logged_devices(run_dir: Path) -> dict[str, str]:
    """Where the trainer and the first worker say they ran, from their logs' start-up lines
    ('trainer on <device>, precision <p>', 'torch engine on <device>')."""
    def grep(name: str, pattern: str) -> re.Match | None:
        log = run_dir / "logs" / f"{name}.log"
        return re.search(pattern, log.read_text(errors="replace")) if log.is_file() else None

    out = {}
    trainer = grep("trainer", r"trainer on (\S+), precision (\w+)")
    if trainer:
        out.update(trainer_device=trainer.group(1), precision=trainer.group(2))
    worker = grep("rollout-0", r"torch engine on (\S+)")
    if worker:
        out["rollout_device"] = worker.group(1)
    return out


def summary(rows: list[StepRecord], skip: int, steps: int) -> dict:
    by_step = {r.step: r.figures for r in rows if r.figures.step_s is not None}
    window = [by_step[s] for s in range(skip + 1, steps + 1) if s in by_step]
    if not window:
        raise RuntimeError(f"the run has no step metrics after step {skip}")
    last = by_step[max(by_step)]
    return {
        "steps_measured": len(window),
        "step_s_mean": mean_of(window, "step_s"),
        "publish_stall_s_mean": mean_of(window, "publish_stall_s"),
        "publish_copy_s_mean": mean_of(window, "publish_copy_s"),
        "publish_send_s_mean": mean_of(window, "publish_send_s"),
        "generated_tokens_per_s": last.generated_tokens_per_s,
        "engine_logp_absdiff_mean": mean_of(window, "engine_logp_absdiff"),
        "engine_logp_absdiff_max": max_of(window, "engine_logp_absdiff"),
        "reward_mean_last": last.reward_mean,
    }


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser("gpu_smoke", __doc__.splitlines()[0])
    parser.add_argument("--config", default="examples/tiny_cpu.yaml")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--skip", type=int, default=2, help="warm-up steps left out")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override beside the devices (repeatable)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.skip = 3, 1
    if not 0 <= args.skip < args.steps:
        parser.error("need 0 <= --skip < --steps")
    import torch

    if not torch.cuda.is_available():
        if args.smoke:
            harness.skip(args, "no CUDA GPU on this machine")
        print("gpu_smoke: no CUDA GPU on this machine (torch.cuda.is_available() is False); "
              "run it where one is", file=sys.stderr)
        return 2
    run_dir = ROOT / "runs" / "bench_gpu_smoke"
    cfg = run_config(args.config, ["trainer.device=cuda", *args.set], args.steps, run_dir)
    if isinstance(cfg.rollout.engine, TorchEngineConfig):  # vLLM picks its own GPU
        cfg.rollout.engine.device = "cuda"
    rows = run_stack(cfg)
    harness.report(args, {"bench": "gpu_smoke", "config": args.config, "steps": args.steps,
                          "skip": args.skip, "set": args.set,
                          "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                          **logged_devices(run_dir), **summary(rows, args.skip, args.steps)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
