"""A user's own task on the real stack: a JSONL file read through `datasets`, a raw prompt
template, and `module:function` rewards that read the record's other columns or score a
whole group. A reward that raises scores 0 with its error (tests/unit/test_rewards_imported.py)
and the trainer counts it as train/reward_errors."""

import json

from relayrl.config import AdditionTaskConfig, RunConfig, TinyModel
from relayrl.runtime.metrics import read_metrics
from relayrl_torch.models.cache import resolve_model_path
from tests.conftest import run_to_end, small_stack_config

STEPS = 4


def problems_file(tmp):
    rows = [{"a": a, "b": b, "answer": str(a + b)} for a in range(10) for b in range(10)]
    rows.insert(17, {"a": 1, "b": 2})  # no answer: skipped and counted, not a crash
    path = tmp / "sums.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def own_task_run(tmp, reward):
    data = small_stack_config(tmp, steps=STEPS)
    model = TinyModel.model_validate(data["model"])
    path = resolve_model_path(model, AdditionTaskConfig.model_validate(data["task"]))
    data["model"] = {"kind": "hf", "path": str(path)}
    data["task"] = {"source": "dataset", "path": str(problems_file(tmp)), "eval_size": 8,
                    "eval_fraction": 0.1, "reward": reward,
                    "prompt": {"template": "{a}+{b}=", "format": "raw"}}
    # every step must train: on a loaded machine a small stack's whole batch can lag past
    # its staleness bound of 1 and be dropped, which is not what this test is about
    data["trainer"]["max_staleness"] = STEPS
    cfg = RunConfig.model_validate(data)
    return run_to_end(cfg)


def test_a_dataset_and_python_rewards_train(tmp_path):
    """One run, two kinds of user reward summed: one per completion reading the record's
    columns (metadata), one called once per group (TRL's `completions` form)."""
    cfg, code, state = own_task_run(
        tmp_path, "tests.integration.own_rewards:sum_of_operands"
                  "+0.5*tests.integration.own_rewards:group_mean_match")
    assert code == 0
    rows = read_metrics(f"{cfg.run_dir}/metrics.jsonl")
    trained = [r for r in rows if "train/loss" in r]
    assert len(trained) == STEPS
    assert all(r["train/reward_errors"] == 0 for r in trained)
    assert all(0 <= r["train/reward_mean"] <= 1.5 for r in trained)
    assert any("eval/accuracy_sampled" in r for r in rows)
    assert state["audit"].balanced, state["audit"].render()
