"""The reward of a finished episode, the rule both the rollout worker
(rollout_svc/episodes.py, a group's samples) and the evaluator
(relayrl_torch/evaluation/episodes.py, one episode at a time) score by:

  - an episode whose environment failed scores 0, with the environment's error
    (relayrl_tasks/episodes/play.py gives its form);
  - one whose environment returned rewards earns their sum, checked as any reward is
    (finite, within `reward_range` where the caller enforces one; else 0 with the error);
  - one whose environment returned none earns the task's reward on the model's final message,
    with the prompt and the episode's whole conversation for the rewards that ask for them.

    episode_rewards(episodes, reward_fn, reference, metadata, reward_range, prompt=...)
        -> [(reward, error)]   # one per episode, in order; never raises

The task's reward is called once for the episodes that need it, as a group
(relayrl_tasks.rewards.score_group), so a batched or remote reward makes one call for them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from relayrl_tasks.rewards.calling import Metadata, Prompt
from relayrl_tasks.rewards.scoring import score, score_group


class Played(Protocol):
    """What the rule reads of a finished episode."""
    rewards: Sequence[float]  # what its environment's steps returned
    last_reply: str  # the model's final message
    messages: Sequence[Mapping[str, str]]  # the conversation its environment saw
    error: str  # its environment's error, '' when there was none


def episode_rewards(episodes: Sequence[Played], reward_fn: Callable, reference: str,
                    metadata: Metadata | None = None,
                    reward_range: tuple[float, float] | None = None, *, prompt: Prompt = ""
                    ) -> list[tuple[float, str]]:
    """(reward, error) of each episode of one problem (`reference`, `metadata`, `prompt`), by
    the rule in the module docstring."""
    asked = [e for e in episodes if not e.error and not e.rewards]
    task_scores = iter(score_group(
        reward_fn, [e.last_reply for e in asked], reference, metadata, reward_range,
        prompt=prompt, conversations=[conversation(e.messages, e.last_reply) for e in asked]))
    return [(0.0, e.error) if e.error
            else environment_total(e.rewards, reward_range) if e.rewards
            else next(task_scores) for e in episodes]


def environment_total(rewards: Sequence[float],
                      reward_range: tuple[float, float] | None = None) -> tuple[float, str]:
    """(reward, error) of an episode whose environment returned `rewards`: their sum, checked
    as any reward is (finite, within `reward_range`; else 0 with the error)."""
    total = math.fsum(rewards)
    return score(lambda _c, _r: total, "", "", reward_range)


def conversation(messages: Sequence[Mapping[str, str]],
                 last_reply: str) -> list[Mapping[str, str]]:
    """An episode's whole conversation, ending with the model's last reply (which the
    episode's messages hold already when the environment stepped on it)."""
    said = [m for m in messages if m["role"] == "assistant"]
    if said and said[-1]["content"] == last_reply:
        return list(messages)
    return [*messages, {"role": "assistant", "content": last_reply}]
