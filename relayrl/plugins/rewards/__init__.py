"""Rewards: what a reward function is and how it is called (relayrl.plugins.rewards.registry),
and `@register("name")`, which makes a function available to configs under that name. The
rewards RelayRL ships (math_verify, exact_match, format rewards, reasoning-gym's verifiers,
LLM judges, reward servers) and scoring are relayrl_tasks.rewards.
"""

from relayrl.plugins.rewards.registry import REWARDS, Metadata, RewardFn, as_reward, register

__all__ = ["REWARDS", "Metadata", "RewardFn", "as_reward", "register"]
