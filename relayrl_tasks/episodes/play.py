"""One episode's moves that do not depend on who samples the model: opening it, answering a
reply of the model, and whether the model gets another turn. The rollout worker
(rollout_svc/episode_generator.py) and the evaluator (relayrl_torch/evaluation/episodes.py)
both play episodes through these, so an evaluated episode ends as a trained one does (and is
scored by the same rule, relayrl_tasks/episodes/reward.py).

    calls = EnvCalls(cfg.max_stuck_calls)                 # one per process that plays
    openings = open_episodes(env_cls, cfg, problems, glue, encode_problem, calls)
    moves = answer_all([Turn(env, messages, reply, env_tokens), ...], glue, cfg, calls)
    if move.error or move.ends: ...                       # else append move.glue

Calls into a user's environment run on threads, all of a batch at once, each waited for
with its deadline (relayrl/plugins/envs/calls.py): slow steps of one turn cost one deadline,
not their sum. A user's environment may raise, hang or flood; each becomes an `error` string
on its own episode (the sample scores 0 with it), never an exception here. The string's form
is stable, so that errors can be counted per kind from the samples:

    environment: <Class>.<method>: <kind>: <detail>

`<method>` is `reset` (the constructor and reset) or `step`; `<kind>` is one of KINDS:
  raised                 the call raised (detail: `<ExceptionType>: <message>`)
  invalid                it returned something the protocol does not take
  max_observation_chars  its messages held more characters than allowed (before tokenizing)
  max_env_tokens         the episode's environment tokens would pass the budget
  reset_timeout_s        the constructor and reset did not return within the limit
  step_timeout_s         step did not return within the limit
  max_stuck_calls        not called: too many earlier calls are still running past theirs
  prompt_window          the opening reset returned is longer than the prompts the worker's
                         engine takes (its window less rollout.max_new_tokens); the episode
                         then opens with the task's own prompt, which the task measured
Each limit kind is the name of its field of rollout.environment, and its detail gives the
value and the limit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from relayrl.config.environment import EnvironmentConfig
from relayrl.plugins.envs.calls import Done, EnvCalls, Handle, Overran, Refused
from relayrl.plugins.envs.protocol import (
    Environment,
    Invalid,
    Step,
    TooLarge,
    as_step,
    check_messages,
)
from relayrl.plugins.tasks.problem import Problem
from relayrl_tasks.envs.loading import make_environment
from relayrl_tasks.episodes.turns import TurnGlue

KINDS = ("raised", "invalid", "max_observation_chars", "max_env_tokens", "reset_timeout_s",
         "step_timeout_s", "max_stuck_calls", "prompt_window")


class Opening(NamedTuple):
    """An episode as its environment opened it."""
    env: Environment | None  # None: the constructor or reset failed (`error` says why)
    messages: list[dict[str, str]]  # the conversation so far, as the template renders it
    tokens: list[int]  # the context the model's first turn continues
    error: str


class Turn(NamedTuple):
    """A model reply the environment is to answer."""
    env: Environment
    messages: Sequence[Mapping[str, str]]  # the conversation the reply answers
    reply: str  # the model's (stopped) reply
    env_tokens: int  # environment tokens the episode holds so far


class Move(NamedTuple):
    """The environment's answer to a reply: its step, the tokens to append, or an error."""
    step: Step | None  # None: the step failed (`error` says why)
    glue: list[int]  # environment tokens to append when the episode goes on
    error: str

    @property
    def ends(self) -> bool:
        """The environment ended the episode (done, or nothing more for the model to read)."""
        return self.step is None or self.step.done or not self.step.messages


def failure(where: str, kind: str, detail: str) -> str:
    """An environment error as samples carry it: `environment: <where>: <kind>: <detail>`."""
    assert kind in KINDS, kind
    return f"environment: {where}: {kind}: {detail}"


def error_kind(error: str) -> str | None:
    """The kind of an error string this module made, else None."""
    parts = error.split(": ", 3)
    if len(parts) == 4 and parts[0] == "environment" and parts[2] in KINDS:
        return parts[2]
    return None


def _call_error(where: str, outcome: Done | Overran | Refused, cfg: EnvironmentConfig,
                timeout_field: str) -> str:
    """The error of a call that did not return a usable value, else ''."""
    if isinstance(outcome, Overran):
        limit = getattr(cfg, timeout_field)
        return failure(where, timeout_field, f"no answer within {limit} s "
                       f"(rollout.environment.{timeout_field} {limit})")
    if isinstance(outcome, Refused):
        return failure(where, "max_stuck_calls", f"not called: {outcome.stuck} calls are still "
                       "running past their deadlines (rollout.environment.max_stuck_calls "
                       f"{cfg.max_stuck_calls})")
    err = outcome.error
    if err is None:
        return ""
    if isinstance(err, TooLarge):
        return failure(where, "max_observation_chars", f"returned {err.chars} characters of "
                       f"messages (rollout.environment.max_observation_chars {err.limit})")
    if isinstance(err, Invalid):
        return failure(where, "invalid", str(err).removeprefix(f"{where}: "))
    return failure(where, "raised", f"{type(err).__name__}: {err}")


def open_episodes(env_cls: type[Environment], cfg: EnvironmentConfig,
                  problems: Sequence[Problem], glue: TurnGlue, encode_problem: Any,
                  calls: EnvCalls) -> list[Opening]:
    """One fresh environment per problem, reset with it (all at once); its opening messages
    laid out by the chat template, or the task's own prompt (`encode_problem(text,
    messages)`) when it gives none or failed."""
    where = f"{env_cls.__name__}.reset"

    def opener(problem: Problem) -> Callable[[], Any]:
        def call() -> tuple[Environment, tuple[dict[str, str], ...] | None]:
            env = make_environment(env_cls, cfg.options)
            raw = env.reset(problem)
            return env, (None if raw is None
                         else check_messages(raw, where, cfg.max_observation_chars))
        return call

    outcomes = calls.call_all([opener(p) for p in problems], cfg.reset_timeout_s)
    openings = []
    for problem, outcome in zip(problems, outcomes, strict=True):
        env, opened, error = None, None, _call_error(where, outcome, cfg, "reset_timeout_s")
        if not error:
            assert isinstance(outcome, Done)
            env, opened = outcome.value
        if opened:
            openings.append(Opening(env, list(opened), glue.prompt(opened), error))
            continue
        messages = ([dict(m) for m in problem.messages]
                    or [{"role": "user", "content": problem.text}])
        openings.append(Opening(env, messages,
                                encode_problem(problem.text, problem.messages), error))
    return openings


def start_step(turn: Turn, cfg: EnvironmentConfig, calls: EnvCalls) -> Handle | Refused:
    """The environment's step on its model's (stopped) reply, started on a thread of
    `calls`: `answer` makes it the episode's move once it returned or ran out of time
    (`calls.due(started, cfg.step_timeout_s)`)."""
    where = f"{type(turn.env).__name__}.step"
    env, reply = turn.env, turn.reply
    return calls.start(lambda: as_step(env.step(reply), where, cfg.max_observation_chars))


def answer(turn: Turn, started: Handle | Refused, glue: TurnGlue, cfg: EnvironmentConfig,
           calls: EnvCalls) -> Move:
    """The move of a step `start_step` started, waited for until its deadline at most, and
    the template's tokens around its observation when the episode goes on."""
    return _move(turn, calls.wait(started, cfg.step_timeout_s), glue, cfg)


def answer_all(turns: Sequence[Turn], glue: TurnGlue, cfg: EnvironmentConfig,
               calls: EnvCalls) -> list[Move]:
    """Each environment's step on its model's (stopped) reply, all at once (start_step,
    answer)."""
    started = [start_step(t, cfg, calls) for t in turns]
    return [answer(t, s, glue, cfg, calls) for t, s in zip(turns, started, strict=True)]


def _move(t: Turn, outcome: Done | Overran | Refused, glue: TurnGlue,
          cfg: EnvironmentConfig) -> Move:
    where = f"{type(t.env).__name__}.step"
    error = _call_error(where, outcome, cfg, "step_timeout_s")
    if error:
        return Move(None, [], error)
    assert isinstance(outcome, Done)
    step = outcome.value
    if not step.messages or step.done:
        return Move(step, [], "")
    try:  # bounded: the observation's size was checked on the environment's thread
        tokens = glue.between(t.messages, t.reply, True, step.messages)
    except ValueError as err:  # a template that rewrites earlier turns
        return Move(None, [], failure(where, "invalid", str(err)))
    if t.env_tokens + len(tokens) > cfg.max_env_tokens:
        return Move(None, [], failure(where, "max_env_tokens", f"the episode's environment "
                                      f"tokens would reach {t.env_tokens + len(tokens)} "
                                      f"(rollout.environment.max_env_tokens "
                                      f"{cfg.max_env_tokens})"))
    return Move(step, tokens, "")


def goes_on(move: Move, *, turns: int, max_turns: int, policy_tokens: int,
            max_new_tokens: int, context: int, context_length: int) -> bool:
    """Whether the model gets another turn after `move`: the environment did not end the
    episode, and the turn, token and context budgets leave room for one."""
    return not (move.error or move.ends or turns >= max_turns
                or policy_tokens >= max_new_tokens
                or context + len(move.glue) >= context_length)

