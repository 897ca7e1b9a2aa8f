"""The example agent runs outside the services against the real stack: it plays its
multi-turn episodes through a worker's OpenAI-compatible server and submits them to the
buffer, and the trainer trains on them alongside the scheduler's prompts, every one
accounted for."""

import os
import subprocess
import sys
from pathlib import Path

import redis as redis_lib

from relayrl.config import RunConfig
from relayrl.contracts import ledger
from relayrl.contracts.keys import RunKeys, is_external
from relayrl.runtime.metrics import read_metrics
from relayrl_ops.launcher import Launcher
from tests.conftest import free_ports, small_stack_config

ROOT = Path(__file__).resolve().parents[2]
STEPS, GROUPS, GROUP_SIZE, AGENT_GROUPS = 4, 2, 4, 2


def test_agent_groups_are_trained_and_the_books_balance(tmp_path):
    data = small_stack_config(tmp_path, steps=STEPS, groups_per_batch=GROUPS,
                              group_size=GROUP_SIZE)
    data["scheduler"]["max_prompts"] = STEPS * GROUPS - AGENT_GROUPS
    (http_port,) = free_ports(1)
    data["rollout"]["http_base_port"] = http_port
    launcher = Launcher(RunConfig.model_validate(data), show_trainer_output=False)
    try:
        launcher.start()
        cfg = launcher.cfg
        env = {**os.environ, "RELAYRL_TOKEN": os.environ[cfg.auth.token_env]}  # the run's
        agent = subprocess.run(
            [sys.executable, str(ROOT / "examples/agent/chain_agent.py"),
             "--http", f"127.0.0.1:{http_port}", "--buffer", cfg.buffer.endpoint.address,
             "--groups", str(AGENT_GROUPS), "--group-size", str(GROUP_SIZE),
             "--max-tokens", "3"],
            capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
        assert agent.returncode == 0, agent.stderr
        assert agent.stdout.count("mean reward") == AGENT_GROUPS
        assert launcher.wait() == 0
        r = redis_lib.Redis.from_url(cfg.redis.url)
        keys = RunKeys(cfg.run_id)
        led = ledger.all_members(r, keys)
    finally:
        launcher.shutdown()
    rows = read_metrics(f"{cfg.run_dir}/metrics.jsonl")
    assert sum(row.get("train/external_groups", 0) for row in rows) == AGENT_GROUPS
    finished = led["consumed"] | led["dropped"]
    external = {p for p in finished if is_external(p)}
    assert len(external) == AGENT_GROUPS
    assert finished - external == led["leased"]  # every scheduler prompt, once
    assert not led["consumed"] & led["dropped"]
    assert led["batched"] == finished


def test_a_tool_agent_written_with_the_openai_client_is_trained(tmp_path):
    """examples/agent/tool_agent.py: chat completions with `tools`, its calls run, their
    results sent back; each conversation submitted as one trajectory and trained."""
    from relayrl.models.smollm2 import ensure_smollm2
    from relayrl_testkit.families import build_family

    model = build_family("llama", tmp_path / "llama",
                         ensure_smollm2(ROOT / ".cache/relayrl/models"))
    steps, groups = 2, 2
    data = small_stack_config(tmp_path, steps=steps, groups_per_batch=groups,
                              group_size=GROUP_SIZE)
    data["model"] = {"kind": "hf", "path": str(model)}
    data["scheduler"]["max_prompts"] = steps * groups - AGENT_GROUPS
    data["trainer"]["max_staleness"] = steps  # the agent's slow turns may lag a version
    (http_port,) = free_ports(1)
    data["rollout"].update(http_base_port=http_port, max_new_tokens=16, num_workers=1)
    data["scheduler"]["start_after_workers"] = 1
    launcher = Launcher(RunConfig.model_validate(data), show_trainer_output=False)
    try:
        launcher.start()
        cfg = launcher.cfg
        env = {**os.environ, "RELAYRL_TOKEN": os.environ[cfg.auth.token_env]}
        agent = subprocess.run(
            [sys.executable, str(ROOT / "examples/agent/tool_agent.py"),
             "--http", f"127.0.0.1:{http_port}", "--buffer", cfg.buffer.endpoint.address,
             "--groups", str(AGENT_GROUPS), "--group-size", str(GROUP_SIZE),
             "--max-tokens", "16", "--max-turns", "2"],
            capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
        assert agent.returncode == 0, agent.stderr
        assert agent.stdout.count("mean reward") == AGENT_GROUPS
        assert launcher.wait() == 0
    finally:
        launcher.shutdown()
    rows = read_metrics(f"{cfg.run_dir}/metrics.jsonl")
    assert sum(row.get("train/external_groups", 0) for row in rows) == AGENT_GROUPS
