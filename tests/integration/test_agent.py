"""Agents run outside the services against the real stack: the chain agent (completions with
token-id prompts, an environment turn between answers) and the tool agent (chat completions
with `tools`, written with the `openai` client alone) play their multi-turn episodes through
a worker's OpenAI-compatible server and submit them to the buffer; the tagged agent only tags
its requests and reports rewards, and the worker records and submits its episodes. The
trainer trains on them alongside the scheduler's prompts, every one accounted for. The model
is a tiny Llama with SmolLM2's tokenizer and chat template."""

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
from relayrl_testkit.families import build_family
from relayrl_torch.models.smollm2 import ensure_smollm2
from tests.conftest import free_ports, small_stack_config

ROOT = Path(__file__).resolve().parents[2]
STEPS, GROUPS, GROUP_SIZE, AGENT_GROUPS = 5, 2, 4, 2  # AGENT_GROUPS from each agent
AGENTS = 3


def agent(script: str, http_port: int, cfg: RunConfig, *flags: str) -> str:
    """Run examples/agent/<script> against the stack; its stdout."""
    env = {k: v for k, v in os.environ.items() if k != cfg.auth.token_env}  # not the service's
    env["RELAYRL_AGENT_TOKEN"] = os.environ[cfg.auth.agent_token_env]  # the examples' default
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples/agent" / script), "--http",
         f"127.0.0.1:{http_port}", "--groups", str(AGENT_GROUPS), "--group-size",
         str(GROUP_SIZE), *flags],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_agent_groups_are_trained_and_the_books_balance(tmp_path):
    model = build_family("llama", tmp_path / "llama",
                         ensure_smollm2(ROOT / ".cache/relayrl/models"))
    data = small_stack_config(tmp_path, steps=STEPS, groups_per_batch=GROUPS,
                              group_size=GROUP_SIZE)
    data["model"] = {"kind": "hf", "path": str(model)}
    data["scheduler"]["max_prompts"] = STEPS * GROUPS - AGENTS * AGENT_GROUPS
    data["trainer"]["max_staleness"] = STEPS  # an agent's slow turns may lag a version
    data["eval"] = {"every": 0}
    (http_port,) = free_ports(1)
    data["rollout"].update(http_base_port=http_port, max_new_tokens=16, num_workers=1)
    data["scheduler"]["start_after_workers"] = 1
    launcher = Launcher(RunConfig.model_validate(data), show_trainer_output=False)
    try:
        launcher.start()
        cfg = launcher.cfg
        buffer = ("--buffer", cfg.buffer.endpoint.address)
        chain = agent("chain_agent.py", http_port, cfg, *buffer, "--max-tokens", "3")
        tools = agent("tool_agent.py", http_port, cfg, *buffer, "--max-tokens", "16",
                      "--max-turns", "2")
        # submits nothing itself: the worker records its tagged episodes and submits them
        tagged = agent("tagged_agent.py", http_port, cfg, "--max-tokens", "16",
                       "--max-turns", "2")
        assert chain.count("mean reward") == tools.count("mean reward") == AGENT_GROUPS
        assert tagged.count("submitted, mean reward") == AGENT_GROUPS
        assert launcher.wait() == 0
        r = redis_lib.Redis.from_url(cfg.redis.url)
        led = ledger.all_members(r, RunKeys(cfg.run_id))
    finally:
        launcher.shutdown()
    rows = read_metrics(f"{cfg.run_dir}/metrics.jsonl")
    assert sum(row.get("train/external_groups", 0) for row in rows) == AGENTS * AGENT_GROUPS
    finished = led["consumed"] | led["dropped"]
    external = {p for p in finished if is_external(p)}
    assert len(external) == AGENTS * AGENT_GROUPS
    assert finished - external == led["leased"]  # every scheduler prompt, once
    assert not led["consumed"] & led["dropped"]
    assert led["batched"] == finished
