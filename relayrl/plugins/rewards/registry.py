"""The table of named reward functions. Score them with relayrl.plugins.rewards.scoring."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable

RewardFn = Callable[..., float]
"""(completion, reference) -> reward, or another form of relayrl.plugins.rewards.calling."""

REWARDS: dict[str, RewardFn] = {}
# name -> (module, pip requirement) pairs a reward imports on first use; checked when a spec
# resolves, so a missing library stops the run at start-up instead of scoring every sample 0
REQUIRES: dict[str, tuple[tuple[str, str], ...]] = {}

# Names must stay clear of the spec syntax (`+`, `*`, `remote:`), see relayrl.plugins.rewards.spec.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED = frozenset({"remote"})


def register(name: str,
             requires: tuple[tuple[str, str], ...] = ()) -> Callable[[RewardFn], RewardFn]:
    """Decorator that makes a reward function available to configs under `name`; `requires`:
    (module, pip requirement) pairs it imports lazily."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"reward: name {name!r} must be letters, digits and underscores, "
                         "not starting with a digit")
    if name in RESERVED:
        raise ValueError(f"reward: name {name!r} is reserved")

    def add(fn: RewardFn) -> RewardFn:
        if not callable(fn):
            raise ValueError(f"reward: {name!r} must be registered with a callable, got {fn!r}")
        if name in REWARDS and REWARDS[name] is not fn:
            raise ValueError(f"reward: {name!r} is already registered ({REWARDS[name]!r})")
        REWARDS[name] = fn
        if requires:
            REQUIRES[name] = tuple(requires)
        return fn

    return add


def check_installed(name: str, where: str) -> None:
    """ValueError naming the package when a library reward `name` imports is not installed."""
    for module, requirement in REQUIRES.get(name, ()):
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"{where}: needs the Python package {requirement!r} (module "
                             f"{module!r}), which is not installed here: pip install "
                             f"'{requirement}'")
