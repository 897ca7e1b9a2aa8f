"""The environment protocol: what a multi-turn task implements.

An environment plays one episode against the policy. The rollout worker makes one instance
per sample (each of a group's samples is its own episode), calls `reset` once with the
problem, then alternates: the model writes an assistant message, `step` answers it.

    from relayrl.plugins.envs import Environment, Step

    class Guess(Environment):
        def __init__(self, tries: int = 3):        # rollout.environment.options
            self.tries = tries

        def reset(self, problem):                  # relayrl.plugins.tasks.problem.Problem
            self.answer = problem.reference
            return None                            # None: the task's own prompt opens

        def step(self, message):                   # the model's reply, as text
            if message.strip() == self.answer:
                return Step([], reward=1.0, done=True)
            return Step([{"role": "user", "content": "No, try again."}])

Configured as `rollout.environment: {cls: mypkg.envs:Guess, max_turns: 4, options: {...}}`
(relayrl/config/environment.py). A step may also return a plain (messages, reward, done)
tuple. `reward` None means "no reward from this step"; the sample's reward is the sum of the
rewards the episode returned, or, when it returned none, the task's reward on the model's
final message (rollout_svc/episodes.py).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from relayrl.plugins.rewards import as_reward
from relayrl.plugins.tasks.problem import ROLES, Problem

Message = Mapping[str, str]  # {"role": ..., "content": ...}

class Step(NamedTuple):
    """What an environment answers a reply with: messages for the model, a reward, done."""
    messages: Sequence[Message] = ()  # what the model sees next (user or tool turns)
    reward: float | None = None  # None: this step gives no reward
    done: bool = False


class Environment(ABC):
    """One episode. Instances are not shared between samples or threads."""

    def reset(self, problem: Problem) -> Sequence[Message] | None:
        """The conversation that opens the episode, or None to open with the task's prompt."""
        return None

    @abstractmethod
    def step(self, message: str) -> Step:
        """Answer the model's message (its text, special tokens left out)."""


class Invalid(ValueError):
    """What an environment returned is not what the protocol asks for."""


class TooLarge(ValueError):
    """Messages whose contents hold more characters than allowed."""

    def __init__(self, where: str, chars: int, limit: int):
        super().__init__(f"{where}: more than {limit} characters of messages")
        self.chars, self.limit = chars, limit


def as_step(value: Any, where: str, max_chars: int | None = None) -> Step:
    """A step's return value checked: a Step or a (messages, reward, done) tuple whose
    messages are {role, content} mappings (TooLarge past `max_chars` characters of content);
    ValueError otherwise."""
    if not isinstance(value, tuple) or len(value) != 3:
        raise Invalid(f"{where}: returned {type(value).__name__}, not a Step or a "
                         "(messages, reward, done) tuple")
    messages, reward, done = value
    if reward is not None:
        try:
            reward = as_reward(reward)  # the rule task rewards follow
        except TypeError:
            raise Invalid(f"{where}: reward is a {type(reward).__name__}, not a number or "
                             "None") from None
        if not math.isfinite(reward):
            raise Invalid(f"{where}: reward is {reward}, not a finite number")
    return Step(check_messages(messages, where, max_chars), reward, bool(done))


def check_messages(messages: Any, where: str, max_chars: int | None = None
                   ) -> tuple[dict[str, str], ...]:
    """{role, content} mappings, copied; TooLarge when their contents hold more than
    `max_chars` characters (counted before anything reads them further)."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise Invalid(f"{where}: messages must be a list of {{role, content}} mappings")
    out, chars = [], 0
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in ROLES \
                or not isinstance(m.get("content"), str):
            raise Invalid(f"{where}: message {i} is not a {{role, content}} mapping with a "
                             f"role among {ROLES}")
        chars += len(m["content"])
        if max_chars is not None and chars > max_chars:
            raise TooLarge(where, sum(len(c) for c in _contents(messages)), max_chars)
        out.append({"role": m["role"], "content": m["content"]})
    return tuple(out)


def _contents(messages: Sequence[Any]) -> list[str]:
    """The string contents of `messages`, for the size of an oversized observation."""
    return [m["content"] for m in messages
            if isinstance(m, Mapping) and isinstance(m.get("content"), str)]
