"""How a run loads its environment: `rollout.environment.cls` names a class as
`package.module:Class` or by the short name of one RelayRL ships, and its options build
each episode's instance."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from relayrl.config import ConfigError
from relayrl.plugins.envs import Environment
from relayrl_tasks.rewards.imported import import_user_module

# short names for the environments shipped with relayrl
BUILTIN = {"calculator": "relayrl_tasks.envs.calculator:Calculator",
           "verifiers": "relayrl_tasks.envs.verifiers_env:VerifiersEnvironment",
           "openenv": "relayrl_tasks.envs.openenv_env:OpenEnvEnvironment"}


def load_environment(spec: str) -> type[Environment]:
    """The class named by `package.module:Class` (or a BUILTIN short name)."""
    target = BUILTIN.get(spec, spec)
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"rollout.environment.cls: {spec!r} is not 'package.module:Class' "
                         f"or one of {sorted(BUILTIN)}")
    try:
        module = import_user_module(module_name)
    except ImportError as err:
        raise ConfigError(f"rollout.environment.cls: cannot import {module_name!r} ({err})"
                         ) from None
    cls = getattr(module, attr, None)
    if not isinstance(cls, type) or not callable(getattr(cls, "step", None)):
        raise ConfigError(f"rollout.environment.cls: {target!r} is not a class with a step() "
                         "method")
    return cls


def make_environment(cls: type[Environment], options: Mapping[str, Any]) -> Environment:
    """An instance of `cls` built with the configured options; ValueError naming what failed."""
    try:
        return cls(**options)
    except TypeError as err:
        raise ConfigError(f"rollout.environment.options do not fit {cls.__name__}: {err}"
                         ) from None
