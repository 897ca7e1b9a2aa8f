"""A user's own task on the real stack: a JSONL file read through `datasets`, a raw prompt
template, a `module:function` reward that reads the record's other columns, and one that
raises (scored 0, counted, the run goes on)."""

import json

import pytest

from relayrl.config import AdditionTaskConfig, ModelConfig, RunConfig
from relayrl.metrics import read_metrics
from relayrl.models.cache import resolve_model_path
from relayrl.ops.launcher import Launcher
from tests.conftest import small_stack_config, snapshot

STEPS = 4


def problems_file(tmp):
    rows = [{"a": a, "b": b, "answer": str(a + b)} for a in range(10) for b in range(10)]
    rows.insert(17, {"a": 1, "b": 2})  # no answer: skipped and counted, not a crash
    path = tmp / "sums.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def own_task_run(tmp, reward):
    data = small_stack_config(tmp, steps=STEPS)
    model = ModelConfig.model_validate(data["model"])
    path = resolve_model_path(model, AdditionTaskConfig.model_validate(data["task"]))
    data["model"]["path"] = str(path)
    data["task"] = {"source": "dataset", "path": str(problems_file(tmp)), "eval_size": 8,
                    "eval_fraction": 0.1, "reward": reward,
                    "prompt": {"template": "{a}+{b}=", "format": "raw"}}
    cfg = RunConfig.model_validate(data)
    launcher = Launcher(cfg, show_trainer_output=False)
    try:
        launcher.start()
        code = launcher.wait()
        state = snapshot(launcher.cfg)
    finally:
        launcher.shutdown()
    return launcher.cfg, code, state


@pytest.mark.parametrize("reward", ["tests.integration.own_rewards:sum_of_operands",
                                    "tests.integration.own_rewards:group_mean_match"])
def test_a_dataset_and_a_python_reward_train(tmp_path, reward):
    cfg, code, state = own_task_run(tmp_path, reward)
    assert code == 0
    rows = read_metrics(f"{cfg.run_dir}/metrics.jsonl")
    trained = [r for r in rows if "train/loss" in r]
    assert len(trained) == STEPS
    assert all(r["train/reward_errors"] == 0 for r in trained)
    assert any("eval/accuracy_sampled" in r for r in rows)
    assert state["audit"].balanced, state["audit"].render()


def test_a_reward_that_raises_scores_zero_and_is_counted(tmp_path):
    cfg, code, _ = own_task_run(tmp_path, "tests.integration.own_rewards:broken")
    assert code == 0
    trained = [r for r in read_metrics(f"{cfg.run_dir}/metrics.jsonl") if "train/loss" in r]
    assert trained and all(r["train/reward_errors"] == r["train/samples"] for r in trained)
    assert all(r["train/reward_mean"] == 0 for r in trained)
