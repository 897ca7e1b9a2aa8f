"""Fault injection on the real stack: every kind of process killed (-9) in turn, the time
each takes to recover, and the audit of the run's books at its end.

    python bench/faults.py [--seed 0] [--rounds 3] [--out runs/bench_faults/reliability.md]

Runs a small stack (every service its own process, embedded Redis with append-only
persistence) while a seeded schedule kills (-9) each kind of process in turn, `--rounds`
times over: rollout worker, relay, buffer, scheduler, trainer, Redis. The launcher restarts
each. The run must reach its last step with the audit balanced: no prompt lost, none
trained twice. Writes the table of faults and outcomes to `--out`, records each kind's
recovery time (median and worst) and the audit, and exits 1 unless every fault recovered
and the books balance.
"""

from __future__ import annotations

import datetime
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.common import assign_free_ports  # noqa: E402
from relayrl.config import RunConfig  # noqa: E402
from relayrl_testkit.fault_run import FaultRunResult, fault_settings, run_with_faults  # noqa: E402
from relayrl_testkit.fault_schedule import LANDING_SLACK_STEPS, draw_schedule, steps_needed  # noqa: E402

GROUPS, GROUP_SIZE, WORKERS = 2, 4, 2


def config(run_dir: Path, models: Path, steps: int, rounds: int) -> RunConfig:
    """The tiny addition task on a 2-layer model: a short warm start, 2 prompts x 4 samples
    a step, 2 workers, every prompt accounted for (max_prompts = steps x 2)."""
    data = {
        "run_id": "faults", "run_dir": str(run_dir),
        "model": {"cache_dir": str(models), "hidden_size": 32, "num_layers": 2, "num_heads": 2,
                  "sft_steps": 20, "sft_stop_accuracy": 1.0},
        "task": {"digits": 1, "eval_size": 8},
        "relay": {"keep_versions": 3}, "scheduler": {"max_prompts": steps * GROUPS},
        "buffer": {"group_size": GROUP_SIZE, "groups_per_batch": GROUPS},
        "trainer": {"max_steps": steps, "max_staleness": 1, "checkpoint": {"every": 4},
                    "progress": False},
        "eval": {"every": 0},
        "rollout": {"num_workers": WORKERS, "max_new_tokens": 8, "segment_tokens": 4},
    }
    for section, fields in fault_settings(rounds).items():
        data.setdefault(section, {}).update(fields)
    assign_free_ports(data)
    return RunConfig.model_validate(data)


def render(result: FaultRunResult, command: str, seed: int, rounds: int,
           cfg: RunConfig, steps_per_restart: int, slack: int, max_delay_s: float) -> str:
    a = result.audit
    lines = [
        "# Reliability: process faults on the real stack",
        "",
        f"Written by `{command}` on {datetime.date.today().isoformat()} "
        f"({platform.machine()}, {platform.python_version()}); rerun it rather than editing "
        "this file.",
        "",
        f"Seed {seed}, {rounds} round(s): each round kills (SIGKILL) one process of every kind "
        "in turn (the relay, the buffer, the scheduler, the trainer, the embedded Redis, a "
        "random rollout worker), the launcher restarting it. Each fault is due at a fixed "
        "trainer step: the previous one's, plus a random 1-3 steps, one step to show the run "
        f"recovered, {slack} steps of slack for a kill that lands late and, "
        f"after a worker or relay kill (the run goes on meanwhile), {steps_per_restart} steps "
        "for its restart. It fires at that step (or, if the previous fault has not yet "
        f"recovered, the first step after it has), plus a random 0-{max_delay_s:g} s. Redis "
        "runs with append-only "
        f"persistence (appendfsync {cfg.redis.appendfsync}) and comes back on the same data "
        "and socket.",
        "",
        f"Config: the tiny addition task, {cfg.trainer.max_steps} trainer steps of "
        f"{cfg.buffer.groups_per_batch} prompts x {cfg.buffer.group_size} samples, "
        f"{cfg.rollout.num_workers} workers, staleness bound {cfg.trainer.max_staleness}, "
        f"checkpoint every {cfg.trainer.checkpoint.every} steps, lease TTL "
        f"{cfg.scheduler.lease_ttl_s:g} s, restarts after {cfg.restarts.backoff_s:g} s "
        "(doubling).",
        "",
        "Recovery: seconds from the kill until the process serves again (a new process "
        "healthy on its address; Redis answering) and the trainer has recorded a step past "
        "the one it was at. A killed trainer resumes from its last checkpoint and replays "
        "the steps since, which its figure includes. Audit: `relayrl audit` on the run at "
        "its end.",
        "",
        "| # | fault | at step | at s | recovery s |",
        "|--:|-------|--------:|-----:|-----------:|",
    ]
    for o in result.outcomes:
        rec = "not recovered" if o.recovery_s is None else f"{o.recovery_s:.2f}"
        lines.append(f"| {o.fault.index} | kill -9 {o.fault.target} | {o.at_step} | "
                     f"{o.at_s:.1f} | {rec} |")
    c = a.counts
    lines += [
        "",
        f"Run: exit {result.exit_code}, step {result.final_step} of {result.max_steps}, "
        f"{result.elapsed_s:.0f} s, {len(result.outcomes)} of "
        f"{rounds * 6} faults injected.",
        "",
        "| audit | |",
        "|-------|--:|",
        f"| books balance | {'yes' if a.balanced else 'NO'} |",
        f"| prompts leased | {c['leased']} |",
        f"| trained | {c['trained']} |",
        f"| dropped (stale or filtered) | {c['dropped']} |",
        f"| failed after retries | {c['failed']} |",
        f"| lost (leased, never trained, dropped or failed) | {result.lost} |",
        f"| trained twice | {result.trained_twice} |",
    ]
    if result.injector_error:
        lines += ["", f"Injector error: `{result.injector_error}`"]
    return "\n".join(lines) + "\n"


def figures(result: FaultRunResult, seed: int, rounds: int, cfg: RunConfig) -> dict:
    """The run's record: each fault's recovery, their median and worst by kind, the books."""
    by_kind: dict[str, list[float]] = {}
    for o in result.outcomes:
        if o.recovery_s is not None:
            by_kind.setdefault(o.fault.target, []).append(o.recovery_s)
    c = result.audit.counts
    return {
        "seed": seed, "rounds": rounds, "clean": result.clean,
        "faults_injected": len(result.outcomes),
        "not_recovered": sum(o.recovery_s is None for o in result.outcomes),
        "recovery_s_median": {k: round(statistics.median(v), 2) for k, v in by_kind.items()},
        "recovery_s_max": {k: round(max(v), 2) for k, v in by_kind.items()},
        "final_step": result.final_step, "max_steps": result.max_steps,
        "elapsed_s": round(result.elapsed_s, 1),
        "books_balance": result.audit.balanced, "prompts_leased": c["leased"],
        "trained": c["trained"], "dropped": c["dropped"], "failed": c["failed"],
        "lost": result.lost, "trained_twice": result.trained_twice,
        "workers": cfg.rollout.num_workers, "staleness_bound": cfg.trainer.max_staleness,
    }


def main(argv: list[str] | None = None) -> int:
    p = harness.parser("faults", __doc__.splitlines()[0], rounds=3,
                       rounds_help="times every kind of process is killed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_faults" / "reliability.md",
                   help="the write-up: the schedule, each fault's recovery, the audit")
    p.add_argument("--steps-per-restart", type=int, default=60,
                   help="trainer steps allowed for while a worker or the relay restarts")
    p.add_argument("--keep-run", type=Path, default=None,
                   help="run in this directory and keep it (logs, checkpoints, Redis data)")
    p.add_argument("--models", type=Path, default=ROOT / ".cache" / "relayrl" / "models")
    args = p.parse_args(argv)
    max_delay_s, slack = 1.0, LANDING_SLACK_STEPS
    if args.smoke:  # kills that land within a few steps of their due step: a third the steps
        args.rounds, args.steps_per_restart, max_delay_s, slack = 1, 3, 0.2, 8
        args.out = ROOT / "runs" / "faults_smoke" / "reliability.md"
        args.out.parent.mkdir(parents=True, exist_ok=True)
    schedule = draw_schedule(args.seed, args.rounds, WORKERS, max_delay_s=max_delay_s)
    with tempfile.TemporaryDirectory(prefix="relayrl-faults-") as tmp:
        run_dir = args.keep_run or Path(tmp) / "run"
        steps = steps_needed(schedule, args.steps_per_restart, slack)
        cfg = config(run_dir, args.models, steps, args.rounds)
        result = run_with_faults(cfg, schedule, args.steps_per_restart, slack)
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(result, args.command, args.seed, args.rounds, cfg,
                          args.steps_per_restart, slack, max_delay_s))
    print(out.read_text())
    harness.report(args, figures(result, args.seed, args.rounds, cfg))
    return 0 if result.clean else 1


if __name__ == "__main__":
    sys.exit(main())
