"""Environments written in other libraries' APIs train on the real stack through RelayRL's
adapters: a `verifiers` MultiTurnEnv loaded by `vf.load_environment` (its dataset the
problems, its env_response the turns, its rubric the reward), and an OpenEnv environment
served by OpenEnv's own HTTP server and played through its HTTPEnvClient, one episode per
server at a time. Every sample is an episode of the environment, the books balance. The
model is a tiny Llama with SmolLM2's tokenizer and chat template, whose replies end after a
few tokens."""

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from relayrl.config import RunConfig
from relayrl.runtime.metrics import read_metrics
from relayrl_testkit.families import build_family
from relayrl_torch.models.smollm2 import ensure_smollm2
from tests.conftest import free_ports, run_to_end, small_stack_config

pytest.importorskip("verifiers")
pytest.importorskip("openenv_core")

ROOT = Path(__file__).resolve().parents[2]
STEPS, GROUPS, GROUP_SIZE = 3, 2, 4


def stack_config(tmp_path: Path) -> dict:
    model = build_family("llama", tmp_path / "llama",
                         ensure_smollm2(ROOT / ".cache/relayrl/models"), brief=True)
    data = small_stack_config(tmp_path, steps=STEPS, groups_per_batch=GROUPS,
                              group_size=GROUP_SIZE)
    data["model"] = {"kind": "hf", "path": str(model)}
    data["trainer"]["max_staleness"] = STEPS  # every step trains, on a loaded machine too
    data["eval"] = {"every": 0}
    data["rollout"].update(segment_tokens=0, max_new_tokens=64, num_workers=1)
    data["scheduler"]["start_after_workers"] = 1
    return data


def trained_rows(cfg: RunConfig) -> list[dict]:
    rows = [r for r in read_metrics(f"{cfg.run_dir}/metrics.jsonl") if "train/loss" in r]
    assert len(rows) == STEPS
    for r in rows:
        assert r["train/reward_errors"] == 0
        assert r["train/episodes"] == r["train/samples"] == GROUPS * GROUP_SIZE
    return rows


def test_a_verifiers_environment_trains_on_the_stack(tmp_path):
    log = tmp_path / "scored.jsonl"
    data = stack_config(tmp_path)
    data["task"] = {"source": "verifiers", "env_id": "tests.integration.vf_guess",
                    "env_args": {"log": str(log)}, "eval_size": 4}
    data["rollout"]["environment"] = {"cls": "verifiers", "max_turns": 2}
    cfg, code, state = run_to_end(RunConfig.model_validate(data))
    assert code == 0
    assert state["audit"].balanced, state["audit"].render()
    rows = trained_rows(cfg)
    scored = [json.loads(line) for line in log.read_text().splitlines()]
    # the rubric scored the episodes, each of one or two turns (max_turns 2 holds the
    # environment's own 3), and a wrong first answer was answered with another turn; the
    # few a reply cut by max_new_tokens ended are the task reward's
    assert len(scored) >= 0.75 * STEPS * GROUPS * GROUP_SIZE
    assert {s["turns"] for s in scored} <= {1, 2} and any(s["turns"] == 2 for s in scored)
    assert sum(r["train/turns"] for r in rows) > sum(r["train/episodes"] for r in rows)


def test_an_openenv_environment_served_over_http_trains_on_the_stack(tmp_path):
    log = tmp_path / "guesses.jsonl"
    ports = free_ports(GROUP_SIZE)
    servers = [subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.integration.openenv_guess:app", "--port",
         str(p), "--log-level", "warning"], cwd=ROOT,
        env={**__import__("os").environ, "GUESS_LOG": str(log)}) for p in ports]
    try:
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        wait_healthy(urls)
        data = stack_config(tmp_path)
        data["rollout"]["environment"] = {"cls": "openenv", "max_turns": 2, "options": {
            "client": "tests.integration.openenv_guess:GuessClient", "base_urls": urls,
            "action": "tests.integration.openenv_guess:GuessAction"}}
        cfg, code, state = run_to_end(RunConfig.model_validate(data))
    finally:
        for s in servers:
            s.terminate()
            s.wait(timeout=30)
    assert code == 0
    assert state["audit"].balanced, state["audit"].render()
    rows = trained_rows(cfg)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    resets = sum(c["what"] == "reset" for c in calls)
    assert resets >= STEPS * GROUPS * GROUP_SIZE  # an episode per sample, on the servers
    # each step the model's reply, as the Action's guess; a wrong guess is answered
    assert sum(c["what"] == "step" for c in calls) >= resets
    assert sum(r["train/turns"] for r in rows) > sum(r["train/episodes"] for r in rows)


def wait_healthy(urls: list[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    for url in urls:
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{url} did not come up"
            time.sleep(0.2)
