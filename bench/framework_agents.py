"""Agents written with frameworks train unchanged: an OpenAI Agents SDK agent and a LangChain
agent, each with a tool (examples/agent/frameworks/), play groups of episodes against a
worker's OpenAI-compatible server from bench/.agents-venv (the frameworks, nothing of
RelayRL), only tagging their requests and reporting rewards; the worker records and submits
the episodes, the trainer trains on them beside the scheduler's prompts, and the run's ledger
balances (`relayrl audit`'s checks).

    python bench/framework_agents.py                 # tiny Llama with SmolLM2's tokenizer
    python bench/framework_agents.py --model smollm2 # SmolLM2-135M-Instruct

Prints, per framework, the groups it played and the episodes the worker submitted, the
trainer's external groups against the groups the worker submitted (a ratio that must be 1.0),
and the audit; the record goes to bench/results/framework_agents.jsonl.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import redis as redis_lib  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench import harness  # noqa: E402
from bench.common import assign_free_ports  # noqa: E402
from bench.tools_venv import AGENTS_VENV, agents_python  # noqa: E402
from relayrl.config import RunConfig  # noqa: E402
from relayrl.runtime.metrics import read_metrics  # noqa: E402
from relayrl_ops.audit import audit_redis  # noqa: E402
from relayrl_ops.launcher import Launcher  # noqa: E402
from relayrl_testkit.families import build_family  # noqa: E402
from relayrl_testkit.ports import free_port_block  # noqa: E402
from relayrl_torch.models.smollm2 import ensure_smollm2  # noqa: E402

FRAMEWORKS = ("agents_sdk", "langchain")
PLAY = ROOT / "examples/agent/frameworks/play.py"


def config(work: Path, model: Path, groups: int, group_size: int, prompts: int) -> RunConfig:
    """A two-group-per-step run whose batches take the scheduler's `prompts` and the
    frameworks' `groups` groups in all."""
    per_batch = 2
    steps = (prompts + groups) // per_batch
    data = {
        "run_id": "agents", "run_dir": str(work / "run"),
        "model": {"kind": "hf", "path": str(model)},
        "task": {"digits": 1, "eval_size": 8},
        "relay": {}, "buffer": {"group_size": group_size, "groups_per_batch": per_batch},
        "scheduler": {"max_prompts": prompts, "start_after_workers": 1, "lease_ttl_s": 60},
        "trainer": {"max_steps": steps, "max_staleness": steps, "progress": False},
        "eval": {"every": 0},
        "rollout": {"num_workers": 1, "max_new_tokens": 48, "http_base_port": 1},
    }
    assign_free_ports(data)
    data["rollout"]["http_base_port"] = free_port_block(1)
    data["rollout"]["metrics_base_port"] = free_port_block(1)
    return RunConfig.model_validate(data)


def play(framework: str, python: Path, http: str, groups: int, group_size: int) -> dict:
    start = time.monotonic()
    proc = subprocess.run(
        [str(python), str(PLAY), framework, "--http", http, "--groups", str(groups),
         "--group-size", str(group_size)], capture_output=True, text=True, timeout=1800,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith(framework)]
    print("\n".join(lines), flush=True)
    if proc.returncode:
        print(f"{framework} failed:\n{proc.stderr[-3000:]}", flush=True)
    return {"rc": proc.returncode, "groups": lines, "seconds": time.monotonic() - start,
            "submitted": sum("submitted" in line or "queued" in line for line in lines)}


def agent_figures(cfg: RunConfig) -> dict[str, float]:
    """The worker's agents/* counters (rollout_svc.telemetry.AgentEpisodeStats)."""
    page = httpx.get(f"http://127.0.0.1:{cfg.rollout.metrics_base_port}/metrics", timeout=10)
    return {s.name.removeprefix("relayrl_agents_").removesuffix("_total"): s.value
            for f in text_string_to_metric_families(page.text) for s in f.samples
            if s.name.startswith("relayrl_agents_") and not s.labels.get("reason")
            and not s.labels.get("field")}


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser("framework_agents", __doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["tiny-llama", "smollm2"], default="tiny-llama")
    ap.add_argument("--groups", type=int, default=2, help="groups each framework plays")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4, help="the scheduler's own prompts")
    ap.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    args = ap.parse_args(argv)
    if args.smoke and not (AGENTS_VENV / "pins.txt").is_file():
        harness.skip(args, "the frameworks run in their own venv (bench/.agents-venv), made "
                     "on first use by a full run")
    if args.smoke:
        args.groups, args.prompts, args.frameworks = 1, 1, ["langchain"]
    python = agents_python()
    smollm2 = ensure_smollm2(ROOT / ".cache/relayrl/models")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = smollm2 if args.model == "smollm2" else build_family(
            "llama", work / "llama", smollm2)
        cfg = config(work, model, len(args.frameworks) * args.groups, args.group_size,
                     args.prompts)
        launcher = Launcher(cfg, show_trainer_output=False)
        try:
            launcher.start()
            http = f"127.0.0.1:{cfg.rollout.http_base_port}"
            played = {f: play(f, python, http, args.groups, args.group_size)
                      for f in args.frameworks}
            # a framework that failed leaves the trainer short of its last batches
            failed = any(p["rc"] for p in played.values())
            worker = agent_figures(cfg)
            rc = 1 if failed else launcher.wait(timeout_s=900)
            audit = audit_redis(redis_lib.Redis.from_url(launcher.cfg.redis.url,
                                                         socket_timeout=30), cfg.run_id,
                                cfg.trainer.max_steps)
        finally:
            launcher.shutdown()
        rows = read_metrics(Path(cfg.run_dir) / "metrics.jsonl")
    trained = sum(row.get("train/external_groups", 0) for row in rows)
    submitted = sum(p["submitted"] for p in played.values())
    result = {"model": args.model, "group_size": args.group_size, "frameworks": played,
              "worker": worker, "trainer_rc": rc,
              "external_groups_trained": trained, "groups_submitted": submitted,
              "trained_over_submitted": trained / submitted if submitted else 0.0,
              "audit": audit.to_dict()}
    print(f"trained / submitted external groups: {trained} / {submitted} = "
          f"{result['trained_over_submitted']:.2f} (must be 1.00); audit balanced: "
          f"{audit.balanced}; the worker recorded {worker.get('turns', 0):.0f} turns of "
          f"{worker.get('episodes', 0):.0f} episodes", flush=True)
    harness.report(args, result)
    ok = rc == 0 and audit.balanced and all(p["rc"] == 0 for p in played.values())
    return 0 if ok and trained == submitted == len(args.frameworks) * args.groups else 1


if __name__ == "__main__":
    raise SystemExit(main())
