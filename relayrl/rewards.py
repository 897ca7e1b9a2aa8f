"""Reward functions by name. A failing function marks the sample instead of killing anyone."""

from __future__ import annotations

from collections.abc import Callable

RewardFn = Callable[[str, str], float]


def exact_match(completion: str, reference: str) -> float:
    return 1.0 if completion.strip() == reference.strip() else 0.0


REWARDS: dict[str, RewardFn] = {"exact_match": exact_match}


def get_reward(name: str) -> RewardFn:
    if name not in REWARDS:
        raise ValueError(f"reward: unknown reward function {name!r}; known: {sorted(REWARDS)}")
    return REWARDS[name]


def score(fn: RewardFn, completion: str, reference: str) -> tuple[float, str]:
    """(reward, error). An exception scores 0 and is reported with the sample."""
    try:
        return float(fn(completion, reference)), ""
    except Exception as err:  # a user's reward function may raise anything
        return 0.0, f"{type(err).__name__}: {err}"
