"""One episode's moves that do not depend on who samples the model: opening it, and answering
a reply of the model. The rollout worker (rollout_svc/episode_generator.py) and the
evaluator (relayrl/evaluation/episodes.py) both play episodes through these, so an evaluated
episode ends and is scored by the same rule as a trained one.

    opening = open_episode(env_cls, options, problem, glue, lm)  # context tokens, messages
    move = answer(env, glue, messages, reply)                    # after a stopped reply
    if move.error or move.ends: ...                               # else append move.glue

A user's environment may raise anything, in its constructor, `reset` or `step`; each
becomes an `error` string (the sample scores 0 with it), never an exception here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from relayrl.plugins.envs.protocol import (
    Environment,
    Step,
    as_step,
    check_messages,
    make_environment,
)
from relayrl.plugins.envs.turns import TurnGlue
from relayrl.plugins.rewards import score
from relayrl.plugins.tasks.problem import Problem


class Opening(NamedTuple):
    env: Environment | None  # None: the constructor or reset raised (`error` says why)
    messages: list[dict[str, str]]  # the conversation so far, as the template renders it
    tokens: list[int]  # the context the model's first turn continues
    error: str


class Move(NamedTuple):
    step: Step | None  # None: step raised or returned something that is not a step
    glue: list[int]  # environment tokens to append when the episode goes on
    error: str

    @property
    def ends(self) -> bool:
        """The environment ended the episode (done, or nothing more for the model to read)."""
        return self.step is None or self.step.done or not self.step.messages


def failure(where: str, err: Exception) -> str:
    return f"environment: {where}: {type(err).__name__}: {err}"


def open_episode(env_cls: type[Environment], options: Mapping[str, Any], problem: Problem,
                 glue: TurnGlue, encode_problem: Any) -> Opening:
    """A fresh environment reset with `problem`; its opening messages laid out by the chat
    template, or the task's own prompt (`encode_problem(text, messages)`) when it gives
    none."""
    where = f"{env_cls.__name__}.reset"
    env, opened, error = None, None, ""
    try:
        env = make_environment(env_cls, options)
        raw = env.reset(problem)
        opened = None if raw is None else list(check_messages(raw, where))
    except Exception as err:  # a user's environment may raise anything
        env, error = None, failure(where, err)
    if opened:
        return Opening(env, opened, glue.prompt(opened), error)
    messages = ([dict(m) for m in problem.messages]
                or [{"role": "user", "content": problem.text}])
    return Opening(env, messages, encode_problem(problem.text, problem.messages), error)


def answer(env: Environment, glue: TurnGlue, messages: Sequence[Mapping[str, str]],
           reply: str) -> Move:
    """The environment's step on the model's (stopped) reply, and the template's tokens
    around its observation when the episode goes on."""
    where = f"{type(env).__name__}.step"
    try:
        step = as_step(env.step(reply), where)
        tokens = (glue.between(messages, reply, True, step.messages)
                  if step.messages and not step.done else [])
    except Exception as err:  # a user's environment may raise anything
        return Move(None, [], failure(where, err))
    return Move(step, tokens, "")


def goes_on(move: Move, *, turns: int, max_turns: int, policy_tokens: int,
            max_new_tokens: int, context: int, context_length: int) -> bool:
    """Whether the model gets another turn after `move`: the environment did not end the
    episode, and the turn, token and context budgets leave room for one."""
    return not (move.error or move.ends or turns >= max_turns
                or policy_tokens >= max_new_tokens
                or context + len(move.glue) >= context_length)


def environment_total(rewards: Sequence[float],
                      reward_range: tuple[float, float] | None = None) -> tuple[float, str]:
    """(reward, error) of an episode whose environment returned `rewards`: their sum, checked
    as any reward is (finite, within `reward_range`; else 0 with the error)."""
    total = math.fsum(rewards)
    return score(lambda _c, _r: total, "", "", reward_range)
