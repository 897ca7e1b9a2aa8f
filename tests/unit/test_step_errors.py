"""A step's failed samples are counted per kind of reward and environment error, with one
example of each kind logged; its episodes and turns are counted from the loss masks, as an
episode's PolicyMask writes them."""

from __future__ import annotations

import logging

import numpy as np

from relayrl.contracts.messages import Sample
from relayrl_tasks.episodes.play import failure
from relayrl_tasks.episodes.sequence import PolicyMask, episode_counts
from relayrl_tasks.rewards import score
from relayrl_tasks.rewards.scoring import reward_error_kind
from trainer_svc.record import count_errors


def sample(error: str = "", mask: list[int] | None = None) -> Sample:
    n = len(mask) if mask else 3
    return Sample(prompt_id=1, lease_id="l", worker_id="w", prompt_tokens=[1, 2],
                  response_tokens=[5] * n, logprobs=[-0.1] * n, versions=[0] * n, reward=0.0,
                  reward_error=error, loss_mask=mask)


def error_of(reward_fn, reward_range=None) -> str:
    return score(reward_fn, "answer", "ref", reward_range)[1]


def test_each_reward_failure_is_named_by_its_kind():
    def raises(_c, _r):
        raise KeyError("field")

    assert reward_error_kind(error_of(raises)) == "raised"
    assert reward_error_kind(error_of(lambda _c, _r: float("nan"))) == "not_finite"
    assert reward_error_kind(error_of(lambda _c, _r: "1.0")) == "not_a_number"
    assert reward_error_kind(error_of(lambda _c, _r: 5.0, (0.0, 1.0))) == "reward_range"


def test_errors_are_counted_per_kind_with_one_example_each(caplog):
    timeout = failure("Guess.step", "step_timeout_s", "no answer within 2 s")
    samples = [sample("KeyError: 'a'"), sample("KeyError: 'b'"),
               sample("ValueError: reward is not finite: nan"), sample(timeout), sample()]
    with caplog.at_level(logging.WARNING, logger="trainer_svc.record"):
        counts = count_errors(samples, step=4)
    assert counts.total == 4
    assert counts.reward == {"raised": 2, "not_finite": 1}
    assert counts.environment == {"step_timeout_s": 1}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3  # one per kind, not per sample
    assert any("2 samples" in line and "KeyError: 'a'" in line for line in lines)
    assert any("environment error of kind step_timeout_s" in line for line in lines)


def test_a_step_without_errors_counts_none():
    counts = count_errors([sample(), sample()], step=1)
    assert (counts.total, counts.reward, counts.environment) == (0, None, None)


def test_turns_are_the_runs_of_policy_tokens():
    three_turns = sample(mask=[1, 1, 0, 0, 1, 0, 1, 1])
    one_turn = sample()  # no mask: every token is the policy's
    starts_with_tool = sample(mask=[0, 1, 1, 0, 1])
    assert episode_counts([three_turns, one_turn, starts_with_tool]) == (3, 6)
    assert np.array_equal(one_turn.policy_token_mask, [True] * 3)


def test_the_turns_counted_are_the_turns_the_mask_was_written_with():
    mask = PolicyMask()
    for model, env in ((2, 3), (1, 2), (4, 0)):
        mask.add_model(model)
        mask.add_env(env)
    assert (len(mask), mask.policy_tokens, mask.env_tokens) == (12, 7, 5)
    assert episode_counts([sample(mask=mask.loss_mask())]) == (1, 3)
    alone = PolicyMask()
    alone.add_model(3)
    assert alone.loss_mask() is None  # one turn: the sample carries no mask
