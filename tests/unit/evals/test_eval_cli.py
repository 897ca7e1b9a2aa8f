"""`relayrl eval CONFIG --checkpoint DIR` on a checkpoint of the tiny model (weights only, as
the trainer writes them: the tokenizer comes from the run's model): the table, the JSON line,
--set NAME, --json, and the errors."""

import json

import pytest
import yaml

from relayrl.config import RunConfig
from relayrl_ops.cli import main
from relayrl_torch.models import resolve_model_path
from tests.conftest import MODEL_CACHE


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(config path, checkpoint directory)."""
    from relayrl_torch.models.loading import load_model

    tmp = tmp_path_factory.mktemp("evalcli")
    doc = {"run_id": "evalcli", "run_dir": str(tmp / "run"),
           "model": {"cache_dir": str(MODEL_CACHE), "hidden_size": 32, "num_layers": 2,
                     "num_heads": 2, "sft_steps": 2},
           "task": {"digits": 1, "eval_size": 6},
           "rollout": {"max_new_tokens": 3},
           "eval": {"sets": [{"name": "heldout", "samples": 4},
                             {"name": "other", "task": {"digits": 1, "eval_size": 3, "seed": 5},
                              "reward": "format_boxed", "greedy": False}]}}
    cfg = RunConfig.model_validate(doc)
    lm = load_model(resolve_model_path(cfg.model, cfg.task))
    ckpt = tmp / "run" / "checkpoints" / "step_00000007"
    lm.model.save_pretrained(ckpt)  # no tokenizer: the trainer writes none
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, ckpt


def test_prints_a_table_and_a_json_line(run, capsys):
    config, ckpt = run
    assert main(["eval", str(config), "--checkpoint", str(ckpt)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == f"checkpoint {ckpt}"
    assert lines[1].split() == ["set", "problems", "pass@1", "pass@k", "greedy", "mean",
                                "length"]
    heldout, other = lines[3].split(), lines[4].split()
    assert heldout[:2] == ["heldout", "6"] and heldout[4] == "(k=4)"
    assert other[:3] == ["other", "3", "0.000"] and other[3] == other[4] == "-"
    out = json.loads(lines[-1])
    assert out["checkpoint"] == str(ckpt) and out["step"] == 7
    assert [s["name"] for s in out["sets"]] == ["heldout", "other"]
    assert out["sets"][0]["samples"] == 4 and out["sets"][1]["pass_at_k"] is None
    metrics = out["metrics"]
    assert f"{float(heldout[2]):.3f}" == heldout[2]
    assert abs(metrics["eval/heldout/pass@1"] - float(heldout[2])) < 5e-4
    assert 0 <= metrics["eval/heldout/pass@1"] <= metrics["eval/heldout/pass@4"] <= 1
    assert metrics["eval/other/pass@1"] == 0.0 and "eval/accuracy_sampled" in metrics


def test_one_set_as_json_alone(run, capsys):
    config, ckpt = run
    assert main(["eval", str(config), "--checkpoint", str(ckpt), "--set", "other",
                 "--set", "eval.seed=3", "--json"]) == 0
    (line,) = capsys.readouterr().out.strip().splitlines()
    out = json.loads(line)
    assert [s["name"] for s in out["sets"]] == ["other"]
    assert set(out["metrics"]) == {"eval/other/pass@1", "eval/other/reward_mean",
                                   "eval/other/response_len_mean"}


@pytest.mark.parametrize("extra, message", [
    (["--set", "nope"], "relayrl eval: eval: no set named 'nope'"),
    (["--checkpoint", "/no/such/dir"], "relayrl eval: --checkpoint: /no/such/dir holds no "
                                       "config.json"),
])
def test_errors_exit_2_naming_the_cause(run, capsys, extra, message):
    config, ckpt = run
    args = ["eval", str(config), "--checkpoint", str(ckpt), *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err
