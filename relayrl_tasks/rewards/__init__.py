"""The rewards RelayRL ships and how a run scores with them. Configs name a reward by spec
(relayrl_tasks.rewards.spec): a registered name ("math_verify"), a reward server
("remote:127.0.0.1:50570"), a user's Python ("my_rewards:score", see
relayrl_tasks.rewards.imported), or a weighted sum ("math_verify+0.1*format_boxed"). How a
function is called is relayrl.plugins.rewards. Callers score a group with score_group() (or
one completion with score()), which turn every failure into an error on its sample: a
failing function marks the sample instead of killing anyone.
"""

from relayrl_tasks.rewards.builtin import exact_match, format_boxed, format_think, math_verify
from relayrl_tasks.rewards.imported import ImportedReward
from relayrl_tasks.rewards.reasoning_gym import reasoning_gym_reward
from relayrl_tasks.rewards.remote import RemoteReward, RemoteRewardError
from relayrl_tasks.rewards.scoring import score, score_group
from relayrl_tasks.rewards.server import RewardServicer, serve_reward_model
from relayrl_tasks.rewards.spec import WeightedReward, get_reward, weighted

__all__ = [
    "ImportedReward", "RemoteReward", "RemoteRewardError", "RewardServicer", "WeightedReward",
    "exact_match", "format_boxed", "format_think", "get_reward", "math_verify",
    "reasoning_gym_reward", "score", "score_group", "serve_reward_model", "weighted",
]
