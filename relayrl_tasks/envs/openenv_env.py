"""An OpenEnv environment played as a RelayRL environment.

    rollout:
      segment_tokens: 0
      environment:
        cls: openenv
        max_turns: 6
        options:
          env: mypkg.server:WordleEnvironment     # an openenv_core Environment, one per episode
          env_args: {words: 500}
          # or served over HTTP, one episode per server at a time:
          # client: mypkg.client:WordleEnv        # its HTTPEnvClient
          # base_urls: [http://envs-0:8000, http://envs-1:8000]
          action: mypkg.models:WordleAction       # the Action the model's reply fills
          action_field: guess                     # unset: the Action's one text field
          observation_field: feedback             # unset: the Observation's one text field

OpenEnv environments speak Gym's API with typed dataclasses: `reset() -> Observation`,
`step(Action) -> Observation`, the observation carrying `reward` and `done`. The adapter puts
the model's reply (its text) into the Action's text field and shows the model the
Observation's text field as a user message. The episode opens with the task's prompt, the
reset observation appended to its last user message; each observation's `reward` is the
step's reward, and `done` ends the episode.

In process, each episode builds its own environment (`env`, with `env_args`). Over HTTP an
OpenEnv server holds one episode at a time, so an episode takes a server from `base_urls` for
its whole length (waiting for a free one, within rollout.environment.reset_timeout_s) and
hands it back when it ends or is left.

Needs the openenv extra: `pip install 'relayrl[openenv]'` (openenv-core).
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from relayrl.config import ConfigError
from relayrl.plugins.envs.protocol import Environment, Step
from relayrl.plugins.tasks.problem import Problem
from relayrl_tasks.rewards.imported import import_user_module

BASE_FIELDS = ("metadata", "done", "reward")  # what every Action and Observation has
ACQUIRE_TIMEOUT_S = 60.0

_pools_lock = threading.Lock()
_pools: dict[tuple[str, ...], queue.Queue[str]] = {}


class OpenEnvEnvironment(Environment):
    """One episode of an OpenEnv environment, in process or over HTTP."""

    def __init__(self, action: str, env: str | None = None,
                 env_args: Mapping[str, Any] | None = None, client: str | None = None,
                 base_urls: Sequence[str] = (), action_field: str | None = None,
                 observation_field: str | None = None, request_timeout_s: float = 30.0):
        if bool(env) == bool(client):
            raise ConfigError("rollout.environment.options: set exactly one of env (an "
                              "OpenEnv Environment run in process) and client (its "
                              "HTTPEnvClient, with base_urls)")
        if client and not base_urls:
            raise ConfigError("rollout.environment.options.base_urls: the OpenEnv servers "
                              "the client talks to (one episode per server at a time)")
        self.action_cls = _imported(action, "action")
        self.action_field = action_field or _text_field(self.action_cls, "action")
        self.observation_field = observation_field
        self._release: Any = None
        if env:
            self.env = _imported(env, "env")(**(env_args or {}))
            self._remote = False
        else:
            pool = _pool(tuple(base_urls))
            try:
                url = pool.get(timeout=ACQUIRE_TIMEOUT_S)
            except queue.Empty:
                raise TimeoutError(f"no OpenEnv server of {list(base_urls)} free within "
                                   f"{ACQUIRE_TIMEOUT_S:g} s") from None
            # handed back by close(), or when the episode is dropped (left or failed)
            self._release = weakref.finalize(self, pool.put, url)
            self.env = _imported(client, "client")(base_url=url,
                                                   request_timeout_s=request_timeout_s)
            self._remote = True

    def reset(self, problem: Problem) -> Sequence[Mapping[str, str]] | None:
        """The task's prompt, the reset observation's text appended to it."""
        observation, _reward, _done = self._unpack(self.env.reset())
        messages = [dict(m) for m in problem.messages] or [
            {"role": "user", "content": problem.text}]
        if observation:
            if messages[-1]["role"] == "user":
                messages[-1]["content"] += f"\n\n{observation}"
            else:
                messages.append({"role": "user", "content": observation})
        return messages

    def step(self, message: str) -> Step:
        """The reply as the Action's text field; the observation's text, reward and done."""
        action = self.action_cls(**{self.action_field: message})
        observation, reward, done = self._unpack(self.env.step(action))
        if done:
            self.close()
        shown = [{"role": "user", "content": observation}] if observation and not done else []
        return Step(shown, reward, done)

    def close(self) -> None:
        """Hands an HTTP episode's server back (once)."""
        if self._release is not None:
            self._release()

    def _unpack(self, result: Any) -> tuple[str, float | None, bool]:
        """(text, reward, done) of an Observation, or of the StepResult a client returns."""
        observation = getattr(result, "observation", result) if self._remote else result
        reward = getattr(result, "reward", None)
        done = bool(getattr(result, "done", False))
        return self._text(observation), reward, done

    def _text(self, observation: Any) -> str:
        fields = _fields(observation)
        name = self.observation_field
        if name is None:
            texts = [k for k, v in fields.items() if isinstance(v, str)]
            if len(texts) == 1:
                name = texts[0]
            else:  # no single text field: the model sees them all, as JSON
                return json.dumps(fields, default=str) if fields else ""
        value = fields.get(name)
        if not isinstance(value, str):
            raise ValueError(f"rollout.environment.options.observation_field {name!r}: the "
                             f"observation's {name} is {type(value).__name__}, not text")
        return value


def _fields(observation: Any) -> dict[str, Any]:
    """An Observation's own fields (without done, reward, metadata)."""
    if dataclasses.is_dataclass(observation):
        values = {f.name: getattr(observation, f.name) for f in dataclasses.fields(observation)}
    elif isinstance(observation, Mapping):
        values = dict(observation)
    else:
        values = dict(vars(observation))
    return {k: v for k, v in values.items() if k not in BASE_FIELDS}


def _text_field(action_cls: type, where: str) -> str:
    """The one `str` field of an Action dataclass."""
    names = [f.name for f in dataclasses.fields(action_cls)
             if f.name not in BASE_FIELDS and f.type in (str, "str")]
    if len(names) != 1:
        raise ConfigError(f"rollout.environment.options.action_field: {action_cls.__name__} "
                          f"has text fields {names}; name the one the model's reply fills")
    return names[0]


def _imported(ref: str, option: str) -> Any:
    module_name, _, attr = ref.partition(":")
    try:
        value = getattr(import_user_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigError(f"rollout.environment.options.{option}: cannot import {ref!r} "
                          f"({err})") from None
    if not isinstance(value, type):
        raise ConfigError(f"rollout.environment.options.{option}: {ref!r} is not a class")
    if option == "action" and not dataclasses.is_dataclass(value):
        raise ConfigError(f"rollout.environment.options.action: {ref!r} is not an OpenEnv "
                          "Action (a dataclass)")
    return value


def _pool(urls: tuple[str, ...]) -> queue.Queue[str]:
    """The process's queue of free servers among `urls`."""
    with _pools_lock:
        if urls not in _pools:
            _pools[urls] = queue.Queue()
            for url in urls:
                _pools[urls].put(url)
        return _pools[urls]
