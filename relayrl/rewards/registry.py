"""The table of named reward functions, and scoring that never lets one kill its caller."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

RewardFn = Callable[[str, str], float]
"""(completion, reference) -> reward."""

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


def score(fn: RewardFn, completion: str, reference: str,
          reward_range: tuple[float, float] | None = None) -> tuple[float, str]:
    """(reward, error). An exception, or a reward that is not finite or lies outside
    `reward_range` (buffer.reward_range, where the caller enforces one), scores 0 and is
    reported with the sample."""
    try:
        reward = float(fn(completion, reference))
    except Exception as err:  # a user's reward function may raise anything
        return 0.0, f"{type(err).__name__}: {err}"
    # a NaN, infinite or huge reward would poison every advantage in its group
    if not math.isfinite(reward):
        return 0.0, f"ValueError: reward is not finite: {reward}"
    if reward_range is not None and not reward_range[0] <= reward <= reward_range[1]:
        return 0.0, (f"ValueError: reward {reward:g} is outside buffer.reward_range "
                     f"[{reward_range[0]:g}, {reward_range[1]:g}]")
    return reward, ""
