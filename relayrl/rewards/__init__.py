"""Reward functions by name. A failing function marks the sample instead of killing anyone.

Every reward is `(completion, reference) -> float`. Configs name one by spec (see
relayrl.rewards.spec): a registered name ("math_verify"), a reward server
("remote:127.0.0.1:50570"), or a weighted sum ("math_verify+0.1*format_boxed").
Add your own with `@register("name")`.
"""

from relayrl.rewards.builtin import exact_match, format_boxed, format_think, math_verify
from relayrl.rewards.reasoning_gym import reasoning_gym_reward
from relayrl.rewards.registry import REWARDS, RewardFn, register, score
from relayrl.rewards.remote import RemoteReward, RemoteRewardError
from relayrl.rewards.server import RewardServicer, serve_reward_model
from relayrl.rewards.spec import WeightedReward, get_reward, weighted

__all__ = [
    "REWARDS", "RemoteReward", "RemoteRewardError", "RewardFn", "RewardServicer",
    "WeightedReward", "exact_match", "format_boxed", "format_think", "get_reward",
    "math_verify", "reasoning_gym_reward", "register", "score", "serve_reward_model", "weighted",
]
