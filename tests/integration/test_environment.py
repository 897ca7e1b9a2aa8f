"""A multi-turn environment on the real stack, with either engine: every sample is a two-turn
episode whose environment tokens are masked out of the loss; the trainer's rescoring of the
model's tokens matches the engine's across turns, and the books balance. The separate
evaluator (eval.mode separate) follows the relay and plays the held-out problems as episodes
of the same environment."""

import importlib.util
import json

import pytest

from relayrl.config import RunConfig
from relayrl.runtime.metrics import read_metrics
from tests.conftest import run_to_end, small_stack_config

STEPS = 4


@pytest.mark.parametrize("engine", ["torch", pytest.param("vllm", marks=pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed"))])
def test_an_environment_runs_episodes_on_the_stack(tmp_path, engine):
    data = small_stack_config(tmp_path, steps=STEPS)
    if engine == "vllm":  # head size 32, the smallest vLLM's CPU attention takes; one engine
        data["model"].update(hidden_size=128, num_heads=4)
        data["rollout"].update(engine={"kind": "vllm", "kv_cache_gib": 0.0625}, num_workers=1)
        data["scheduler"]["start_after_workers"] = 1
    log = tmp_path / "steps.jsonl"
    data["rollout"].update(segment_tokens=0, max_new_tokens=8, environment={
        "cls": "tests.integration.own_envs:AskTwice", "max_turns": 2,
        "options": {"log": str(log)}})
    data["eval"] = {"mode": "separate", "every": 2, "poll_s": 0.2}
    # every step must train: on a loaded machine a small stack's whole batch can lag past
    # its staleness bound of 1 and be dropped, which is not what this test is about
    data["trainer"]["max_staleness"] = STEPS
    # and the engine check keeps every version a trained token can come from
    data["trainer"]["engine_check_versions"] = STEPS
    cfg = RunConfig.model_validate(data)
    cfg, code, state = run_to_end(cfg)
    assert code == 0
    assert state["audit"].balanced, state["audit"].render()
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    trained_steps = [s for s in steps if s["prompt_id"] >= 0]
    assert {s["turn"] for s in trained_steps} == {1, 2}  # the glue was appended
    # the evaluator's episodes: held-out problems (negative ids), in the same environment
    assert {s["turn"] for s in steps if s["prompt_id"] < 0} == {1, 2}
    evals = read_metrics(f"{cfg.run_dir}/eval.jsonl")
    assert evals[0]["step"] == 0 and evals[-1]["step"] == STEPS  # the start, and the end
    assert all(0 <= r["eval/heldout/pass@1"] <= 1 for r in evals)
    assert all(0 < r["eval/heldout/response_len_mean"] <= 8 for r in evals)
    trained = [r for r in read_metrics(f"{cfg.run_dir}/metrics.jsonl") if "train/loss" in r]
    assert len(trained) == STEPS
    assert sum(r["train/turns"] for r in trained) > sum(r["train/episodes"] for r in trained)
    assert not any("eval/accuracy_sampled" in r for r in read_metrics(
        f"{cfg.run_dir}/metrics.jsonl"))  # the trainer itself ran no eval
    for r in trained:
        assert r["train/reward_errors"] == 0
        # every sample an episode of one or two turns (a reply the budget cuts ends it)
        assert r["train/episodes"] == r["train/samples"]
        assert r["train/episodes"] <= r["train/turns"] <= 2 * r["train/episodes"]
        # the policy's tokens only: two answers of at most 8 tokens together
        assert r["train/response_len_mean"] <= 8
        assert r["rollout/engine_logp_absdiff"] < 1e-4 and r["rollout/engine_kl"] < 1e-6
