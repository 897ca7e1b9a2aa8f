"""The eval section: defaults, sets with their own task and reward, the errors a user meets,
and the pass@k estimator against hand-computed values."""

import math

import pytest

from relayrl.config import ConfigError, RunConfig
from relayrl.config.base import load_model
from relayrl_torch.evaluation import pass_at_k


def load(data: dict) -> RunConfig:
    return load_model(RunConfig, data, "test")


def test_defaults_keep_one_heldout_set_every_ten_steps():
    cfg = RunConfig()
    assert (cfg.eval.every, cfg.eval.mode) == (10, "inline")
    (only,) = cfg.eval.sets
    assert (only.name, only.task, only.reward, only.samples, only.greedy) == (
        "heldout", None, None, 1, True)
    assert cfg.trainer.wandb.mode == "disabled"


def test_sets_parse_with_their_own_task_reward_and_decoding():
    cfg = load({"eval": {"every": 3, "mode": "separate", "sets": [
        {"name": "main", "samples": 8, "temperature": 0.7, "max_new_tokens": 5},
        {"name": "other", "task": {"digits": 2, "eval_size": 16}, "reward": "exact_match",
         "greedy": False}]}})
    main, other = cfg.eval.sets
    assert (main.samples, main.temperature, main.max_new_tokens) == (8, 0.7, 5)
    assert other.task.source == "addition" and other.task.digits == 2  # shorthand: addition
    assert (other.reward, other.greedy) == ("exact_match", False)
    assert cfg.eval.set_named("other") is other


@pytest.mark.parametrize("sets, message", [
    ([], r"eval\.sets: List should have at least 1 item"),
    ([{"name": "a"}, {"name": "a"}], "names must be distinct; a repeats"),
    ([{"name": "bad name"}], r"eval\.sets\.0\.name"),
    ([{"name": "a", "samples": 0}], r"eval\.sets\.0\.samples"),
    ([{"name": "a", "typo": 1}], r"eval\.sets\.0\.typo: Extra inputs"),
    ([{"name": "a", "task": {"source": "dataset", "path": "x.jsonl"}}],
     "eval.sets 'a': task.source 'dataset' needs model.kind hf or pretrained"),
])
def test_bad_sets_are_refused_naming_the_field(sets, message):
    with pytest.raises(ConfigError, match=message):
        load({"eval": {"sets": sets}})


def test_trainer_eval_every_names_its_new_key():
    with pytest.raises(ConfigError, match=r"trainer\.eval_every is now eval\.every, as "
                       r"in `eval: \{every: 7\}`"):
        load({"trainer": {"eval_every": 7}})


def test_unknown_set_name_lists_the_sets():
    cfg = load({"eval": {"sets": [{"name": "a"}, {"name": "b"}]}})
    with pytest.raises(ValueError, match="no set named 'c' \\(the sets are a, b\\)"):
        cfg.eval.set_named("c")


def test_wandb_mode_is_checked():
    with pytest.raises(ConfigError, match=r"trainer\.wandb\.mode"):
        load({"trainer": {"wandb": {"mode": "sometimes"}}})


@pytest.mark.parametrize("n, c, k, expected", [
    (1, 0, 1, 0.0), (1, 1, 1, 1.0),
    (4, 1, 1, 0.25),            # c / n
    (4, 1, 2, 0.5),             # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (4, 2, 2, 5 / 6),           # 1 - C(2,2)/C(4,2) = 1 - 1/6
    (5, 2, 3, 0.9),             # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (10, 3, 5, 1 - 21 / 252),   # C(7,5) = 21, C(10,5) = 252
    (8, 0, 8, 0.0), (8, 1, 8, 1.0),
    (3, 2, 2, 1.0),             # n - c < k: every draw of 2 holds a solved one
])
def test_pass_at_k_matches_hand_computed_values(n, c, k, expected):
    assert math.isclose(pass_at_k(n, c, k), expected, rel_tol=1e-12)


def test_pass_at_k_refuses_impossible_counts():
    for n, c, k in ((4, 5, 1), (4, 1, 5), (4, 1, 0), (4, -1, 1)):
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(n, c, k)
