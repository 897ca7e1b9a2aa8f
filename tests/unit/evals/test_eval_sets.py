"""Several eval sets, each with its own task and reward, on the tiny model: the metric keys,
the legacy keys of the first set, pass@k from k samples, and errors naming the set."""

import pytest

from relayrl.config import RunConfig
from relayrl.plugins.rewards import REWARDS, register
from relayrl_torch.evaluation import build_sets, evaluate_sets

if "evals_test_one" not in REWARDS:
    register("evals_test_one")(lambda completion, reference: 1.0)


def config(sets: list[dict]) -> RunConfig:
    return RunConfig.model_validate({
        "task": {"digits": 1, "eval_size": 6},
        "rollout": {"max_new_tokens": 3, "temperature": 1.0},
        "eval": {"sets": sets}})


def test_each_set_is_scored_with_its_own_reward(tiny_lm):
    cfg = config([
        {"name": "heldout", "samples": 4},
        {"name": "always", "task": {"digits": 1, "eval_size": 5, "seed": 9},
         "reward": "evals_test_one", "samples": 3, "greedy": False},
        {"name": "never", "reward": "format_boxed", "max_new_tokens": 2, "max_problems": 4},
    ])
    sets = build_sets(cfg)
    assert [len(s.problems) for s in sets] == [6, 5, 4]
    assert [s.default for s in sets] == [True, False, False]
    record, results = evaluate_sets(tiny_lm, sets, seed=0)
    assert record["eval/always/pass@1"] == record["eval/always/pass@3"] == 1.0
    assert "eval/always/accuracy_greedy" not in record  # greedy: false
    assert record["eval/never/pass@1"] == record["eval/never/accuracy_greedy"] == 0.0
    assert "eval/never/pass@2" not in record and 0 < record[
        "eval/never/response_len_mean"] <= 2
    h = "eval/heldout"
    assert 0 <= record[f"{h}/pass@1"] <= record[f"{h}/pass@4"] <= 1
    assert 0 < record[f"{h}/response_len_mean"] <= 3
    # the first set also writes the keys the README, progress bar and plots read
    assert record["eval/accuracy_sampled"] == record[f"{h}/reward_mean"]
    assert record["eval/accuracy_greedy"] == record[f"{h}/accuracy_greedy"]
    assert [(r.name, r.problems, r.samples) for r in results] == [
        ("heldout", 6, 4), ("always", 5, 3), ("never", 4, 1)]
    again, _ = evaluate_sets(tiny_lm, sets, seed=0)
    assert again == record  # seeded: the same answers


def test_only_the_named_sets_are_built():
    cfg = config([{"name": "a"}, {"name": "b", "reward": "evals_test_one"}])
    assert [s.name for s in build_sets(cfg, names=["b"])] == ["b"]
    with pytest.raises(ValueError, match="no set named 'z'"):
        build_sets(cfg, names=["z"])


def test_a_bad_reward_names_the_set():
    cfg = config([{"name": "a"}, {"name": "b", "reward": "no_such_reward"}])
    with pytest.raises(ValueError, match="eval.sets 'b': reward: .*no_such_reward"):
        build_sets(cfg)


def test_a_set_without_held_out_problems_is_refused():
    cfg = config([{"name": "empty", "task": {"digits": 1, "eval_size": 0}}])
    with pytest.raises(ValueError, match="eval.sets 'empty': its task holds no held-out"):
        build_sets(cfg)
