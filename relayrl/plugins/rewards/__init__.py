"""Reward functions by spec. A failing function marks the sample instead of killing anyone.

Configs name a reward by spec (see relayrl.plugins.rewards.spec): a registered name ("math_verify"),
a reward server ("remote:127.0.0.1:50570"), a user's Python ("my_rewards:score", see
relayrl.plugins.rewards.imported), or a weighted sum ("math_verify+0.1*format_boxed"). A function
takes one completion or a group's list of them, and the reference and the task record's metadata if
it declares them (relayrl.plugins.rewards.calling). Callers score a group with score_group() (or one
completion with score()), which turn every failure into an error on its sample.
Add your own names with `@register("name")`.
"""

from relayrl.plugins.rewards.builtin import exact_match, format_boxed, format_think, math_verify
from relayrl.plugins.rewards.calling import Metadata
from relayrl.plugins.rewards.imported import ImportedReward
from relayrl.plugins.rewards.reasoning_gym import reasoning_gym_reward
from relayrl.plugins.rewards.registry import REWARDS, RewardFn, register
from relayrl.plugins.rewards.remote import RemoteReward, RemoteRewardError
from relayrl.plugins.rewards.scoring import score, score_group
from relayrl.plugins.rewards.server import RewardServicer, serve_reward_model
from relayrl.plugins.rewards.spec import WeightedReward, get_reward, weighted

__all__ = [
    "REWARDS", "ImportedReward", "Metadata", "RemoteReward", "RemoteRewardError", "RewardFn",
    "RewardServicer", "WeightedReward", "exact_match", "format_boxed", "format_think",
    "get_reward", "math_verify", "reasoning_gym_reward", "register", "score", "score_group",
    "serve_reward_model", "weighted",
]
