"""relayrl.rewards, an older path of relayrl.plugins.rewards (relayrl.plugins.moved)."""

import relayrl.plugins.rewards as _new
from relayrl.plugins.moved import alias

__getattr__, __all__ = alias(__name__, _new, dict.fromkeys(
    ("ImportedReward", "RemoteReward", "RemoteRewardError", "RewardServicer", "WeightedReward",
     "exact_match", "format_boxed", "format_think", "get_reward", "math_verify",
     "reasoning_gym_reward", "score", "score_group", "serve_reward_model", "weighted"),
    "relayrl_tasks.rewards"))
