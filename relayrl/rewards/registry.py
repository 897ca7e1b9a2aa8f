"""The table of named reward functions. Score them with relayrl.rewards.scoring."""

from __future__ import annotations

import re
from collections.abc import Callable

RewardFn = Callable[..., float]
"""(completion, reference) -> reward, or another form of relayrl.rewards.calling."""

REWARDS: dict[str, RewardFn] = {}

# Names must stay clear of the spec syntax (`+`, `*`, `remote:`), see relayrl.rewards.spec.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED = frozenset({"remote"})


def register(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator that makes a reward function available to configs under `name`."""
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
        return fn

    return add
