"""A run with rollout.environment is evaluated in episodes of it, by the rollout worker's rules
(relayrl_tasks.episodes): the environment's rewards summed, the set's reward when it gave none,
0 when it raised, the max_new_tokens budget over every turn; `environment: false` evaluates
one turn. On the tiny model with a chat template (tests/conftest.py's chat_lm)."""

import pytest

from relayrl.config import RunConfig
from relayrl.plugins.envs import Environment, Step
from relayrl.plugins.rewards import REWARDS, register
from relayrl_torch.evaluation import build_sets, evaluate_sets

if "evals_test_zero" not in REWARDS:
    register("evals_test_zero")(lambda completion, reference: 0.0)


class Thrice(Environment):
    """0.25 for each of two replies, then done with 0.5: an episode played out earns 1.0."""

    opened = 0

    def __init__(self, final: float = 0.5):
        self.final, self.steps = final, 0
        Thrice.opened += 1

    def step(self, message):
        self.steps += 1
        if self.steps == 3:
            return Step([], self.final, True)
        return Step([{"role": "user", "content": "1+1"}], 0.25, False)


class Infinite(Environment):
    """A reward that is not a number the loss could use."""

    def step(self, message):
        return Step([], float("inf"), True)


class Raises(Environment):
    def step(self, message):
        raise RuntimeError("boom")


def config(env: str, max_new_tokens: int = 12, **set_options) -> RunConfig:
    return RunConfig.model_validate({
        "task": {"digits": 1, "eval_size": 5},
        "rollout": {"max_new_tokens": max_new_tokens, "segment_tokens": 0,
                    "environment": {"cls": f"tests.unit.evals.test_eval_episodes:{env}",
                                    "max_turns": 4}},
        "eval": {"sets": [{"name": "heldout", "samples": 3, "reward": "evals_test_zero",
                           **set_options}]}})


def rewards_of(record: dict) -> float:
    return record["eval/heldout/reward_mean"]


def test_each_problem_is_an_episode_scored_by_the_environment(chat_lm):
    (es,) = build_sets(config("Thrice"))  # builds one, to fail at start-up if it cannot
    assert es.environment is not None
    Thrice.opened = 0
    record, (result,) = evaluate_sets(chat_lm, [es], seed=0)
    assert Thrice.opened == 5 * 3 + 5  # 3 sampled episodes and 1 greedy per problem
    # a played-out episode earns 1.0, one cut after k stopped turns 0.25 k; the set's own
    # reward (always 0) only where the environment gave nothing
    assert 0 < rewards_of(record) <= 1.0
    assert result.pass_at_1 <= result.pass_at_k <= 1
    assert 0 < result.response_len_mean <= 12  # the budget spans every turn


def test_the_token_budget_spans_every_turn(chat_lm):
    short, _ = evaluate_sets(chat_lm, build_sets(config("Thrice", max_new_tokens=1)), seed=0)
    # one token each: a reply is either a lone <eos> (stepped once, 0.25) or cut (0)
    assert rewards_of(short) <= 0.25 and short["eval/heldout/response_len_mean"] == 1


def test_an_environment_that_raises_scores_zero(chat_lm):
    record, _ = evaluate_sets(chat_lm, build_sets(config("Raises")), seed=0)
    assert rewards_of(record) == 0 and record["eval/heldout/pass@1"] == 0


def test_a_non_finite_environment_reward_scores_zero_and_never_reaches_the_metrics(chat_lm):
    record, _ = evaluate_sets(chat_lm, build_sets(config("Infinite")), seed=0)
    assert rewards_of(record) == 0 and record["eval/heldout/pass@1"] == 0


def test_environment_false_evaluates_one_turn_with_the_sets_reward(chat_lm):
    (es,) = build_sets(config("Thrice", environment=False))
    assert es.environment is None
    Thrice.opened = 0
    record, _ = evaluate_sets(chat_lm, [es], seed=0)
    assert Thrice.opened == 0 and rewards_of(record) == 0


def test_an_environment_the_evaluator_cannot_build_fails_at_start_up_naming_the_set():
    bad = config("Thrice").model_copy(deep=True)
    bad.rollout.environment.options = {"nope": 1}
    with pytest.raises(ValueError, match="eval.sets 'heldout': rollout.environment.options"):
        build_sets(bad)
