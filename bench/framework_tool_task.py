"""A framework agent learns to call a tool: a LangChain agent with a calculator
(examples/agent/frameworks/calculator_agent.py, three worked calls in its prompt, as
examples/smollm2_tools.yaml opens its episodes) trains SmolLM2-135M-Instruct on the vLLM
engine through a worker's OpenAI-compatible server, unchanged but for its base_url, api key
and episode tag; held-out success before and after a fixed wall time.

    python bench/framework_tool_task.py                # 30 minutes of training
    python bench/framework_tool_task.py --minutes 5

The agent runs from bench/.agents-venv (the frameworks, nothing of RelayRL). The problems are
examples/own_task/problems.jsonl (arithmetic the model gets wrong unaided; every tenth row held
out). Before training, each of --eval-size held-out problems is played once, greedy and
untagged (nothing recorded); then groups of training problems are played, tagged and rewarded
(1 for the right number), for --minutes, while the trainer trains on the worker's recorded
episodes; then the held-out problems again, against the newest version the worker holds. The
trainer's reward curve is copied to docs/results/framework_tool_task.png. Ends with one JSON
line: success and tool use before and after, steps, episodes and the audit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis as redis_lib  # noqa: E402

from bench import harness  # noqa: E402
from bench.common import assign_free_ports  # noqa: E402
from bench.tools_venv import AGENTS_VENV, agents_python  # noqa: E402
from relayrl.config import RunConfig, load_run_config  # noqa: E402
from relayrl.runtime.metrics import read_metrics  # noqa: E402
from relayrl_ops.audit import audit_redis  # noqa: E402
from relayrl_ops.launcher import Launcher  # noqa: E402
from relayrl_testkit.families import build_family  # noqa: E402
from relayrl_testkit.ports import free_port_block  # noqa: E402
from relayrl_torch.models.smollm2 import ensure_smollm2  # noqa: E402

PLAY = ROOT / "examples/agent/frameworks/play.py"
PROBLEMS = ROOT / "examples/own_task/problems.jsonl"
PICTURE = harness.DOCS_RESULTS / "framework_tool_task.png"


def bench_config(run_dir: Path, group_size: int, tiny: Path | None = None) -> RunConfig:
    """examples/smollm2_tools.yaml's model, engine and trainer, its episodes played by the
    agent instead of the worker's environment; the scheduler hands out one prompt of its own
    (it has no setting for none), the agent's groups are the rest. `tiny`: a tiny model on
    the torch engine instead (the smoke)."""
    data = load_run_config(str(ROOT / "examples/smollm2_tools.yaml")).model_dump(mode="json")
    data["run_dir"] = str(run_dir)
    if tiny is not None:
        data["model"] = {"kind": "hf", "path": str(tiny)}
        data["rollout"]["engine"] = {"kind": "torch"}
        data["trainer"]["max_staleness"] = 1_000  # its steps outpace the worker's polls
    data["rollout"]["environment"] = None
    data["scheduler"].update(max_prompts=1, start_after_workers=1)
    data["buffer"]["group_size"] = group_size
    data["trainer"].update(max_steps=1_000_000, progress=False)  # the wall time ends the run
    data["trainer"]["checkpoint"]["every"] = 1_000_000
    data["eval"]["every"] = 0
    assign_free_ports(data)
    data["rollout"]["http_base_port"] = free_port_block(1)
    data["rollout"]["metrics_base_port"] = free_port_block(1)
    return RunConfig.model_validate(data)


def agent(python: Path, http: str, *args: str, timeout_s: float,
          show: bool = False) -> subprocess.CompletedProcess:
    """The agent's run of play.py; `show`: its group lines printed as they come (progress)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with tempfile.TemporaryFile("w+") as err, subprocess.Popen(
            [str(python), str(PLAY), "calculator", "--http", http, "--problems", str(PROBLEMS),
             *args], text=True, stdout=subprocess.PIPE, stderr=err, env=env) as proc:
        killer = threading.Timer(timeout_s, proc.kill)
        killer.start()
        lines = []
        try:
            for line in proc.stdout:
                lines.append(line)
                if show and " group " in line:
                    print(line.rstrip(), flush=True)
            proc.wait()
        finally:
            killer.cancel()
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines),
                                           err.read())


def held_out(python: Path, http: str, size: int, max_tokens: int) -> dict:
    proc = agent(python, http, "--eval", "--eval-size", str(size), "--parallel", "8",
                 "--max-tokens", str(max_tokens), timeout_s=1800)
    if proc.returncode:
        raise RuntimeError(f"the held-out agent failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"held-out: success {result['success']:.3f}, tool use {result['tool_use']:.3f} "
          f"({result['problems']} problems, {result['seconds']:.0f} s)", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser("framework_tool_task", __doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="of training")
    ap.add_argument("--eval-size", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64, help="of one turn")
    args = ap.parse_args(argv)
    if args.smoke and not (AGENTS_VENV / "pins.txt").is_file():
        harness.skip(args, "the framework runs in its own venv (bench/.agents-venv), made on "
                     "first use by a full run")
    if args.smoke:
        args.minutes, args.eval_size, args.group_size, args.max_tokens = 0.3, 4, 2, 8
    python = agents_python()
    run_dir = ROOT / "runs" / ("bench_framework_tool_task" + "_smoke" * args.smoke)
    shutil.rmtree(run_dir, ignore_errors=True)
    tiny = None
    if args.smoke:
        tiny = build_family("llama", run_dir.parent / "tiny-llama", ensure_smollm2(
            ROOT / ".cache/relayrl/models"))
    cfg = bench_config(run_dir, args.group_size, tiny)
    http = f"127.0.0.1:{cfg.rollout.http_base_port}"
    launcher = Launcher(cfg, show_trainer_output=False)
    try:
        launcher.start()
        before = held_out(python, http, args.eval_size, args.max_tokens)
        start = time.monotonic()
        proc = agent(python, http, "--minutes", str(args.minutes), "--parallel", "2",
                     "--group-size", str(args.group_size), "--max-tokens", str(args.max_tokens),
                     timeout_s=args.minutes * 60 + 1800, show=True)
        trained_s = time.monotonic() - start
        groups = [line for line in proc.stdout.splitlines() if " group " in line]
        print(f"played {len(groups)} training groups in {trained_s / 60:.1f} minutes "
              f"(rc {proc.returncode})", flush=True)
        if proc.returncode:
            print("\n".join([*groups[-5:], proc.stderr[-3000:]]), flush=True)
        after = held_out(python, http, args.eval_size, args.max_tokens)
        audit = audit_redis(redis_lib.Redis.from_url(launcher.cfg.redis.url, socket_timeout=30),
                            cfg.run_id, None)
    finally:
        launcher.shutdown()
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "train/samples" in r]
    picture = None
    if (run_dir / "reward.png").is_file() and not args.smoke:
        picture = shutil.copyfile(run_dir / "reward.png", PICTURE)
    result = {"model": "tiny-llama" if args.smoke else "smollm2-135m-instruct",
              "framework": "langchain",
              "minutes": args.minutes, "group_size": args.group_size,
              "before": before, "after": after,
              "gain_points": round(100 * (after["success"] - before["success"]), 1),
              "steps": len(rows), "groups_played": len(groups),
              "episodes_trained": sum(r.get("train/samples", 0) for r in rows),
              "agent_rc": proc.returncode, "audit_balanced": audit.balanced}
    print(f"held-out success {before['success']:.3f} -> {after['success']:.3f} "
          f"({result['gain_points']:+.1f} points) after {len(rows)} steps; audit balanced: "
          f"{audit.balanced}", flush=True)
    harness.report(args, result, picture=picture)
    return 0 if proc.returncode == 0 and audit.balanced else 1


if __name__ == "__main__":
    raise SystemExit(main())
