"""Scoring that never lets a reward kill its caller: every failure is an error on its sample.

    score_group(reward, completions, reference, metadata, reward_range) -> [(reward, error)]

one (reward, error) per completion of a group (its samples share one prompt, reference and
metadata). A reward that raises, returns a value that is not finite, or one outside
`reward_range` (buffer.reward_range, where the caller enforces one) scores 0 with the error
("ExcType: message"). A batched function that raises or returns the wrong number of values or
a non-number marks every completion of its group; a single non-finite value only its own.
A weighted sum fails a completion when any of its terms fails for it. `reward_error_kind`
names the kind of such an error, as metrics.jsonl counts it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from relayrl_tasks.rewards.calling import (
    Conversation,
    Metadata,
    Prompt,
    call_group,
    readonly,
)


def score_group(reward: Callable, completions: Sequence[str], reference: str,
                metadata: Metadata | None = None,
                reward_range: tuple[float, float] | None = None, *, prompt: Prompt = "",
                conversations: Sequence[Conversation] | None = None
                ) -> list[tuple[float, str]]:
    """(reward, error) per completion, in order; never raises. `prompt` and `conversations`
    reach the rewards that declare them (relayrl_tasks.rewards.calling)."""
    raw = call_group(reward, list(completions), reference, readonly(metadata), prompt=prompt,
                     conversations=conversations)
    return [_checked(value, error, reward_range) for value, error in raw]


def score(fn: Callable, completion: str, reference: str,
          reward_range: tuple[float, float] | None = None,
          metadata: Metadata | None = None, *, prompt: Prompt = "",
          conversation: Conversation | None = None) -> tuple[float, str]:
    """(reward, error) for one completion: score_group of a group of one."""
    return score_group(fn, [completion], reference, metadata, reward_range, prompt=prompt,
                       conversations=None if conversation is None else [conversation])[0]


# (kind, what an error of that kind reads), the first match naming it; anything else the
# function raised is "raised"
_KINDS = (("not_finite", "ValueError: reward is not finite"),
          ("reward_range", "is outside buffer.reward_range"),
          ("not_a_number", "reward returned "),
          ("remote", "RemoteRewardError: "),
          ("judge", "JudgeError: "))


def reward_error_kind(error: str) -> str:
    """The kind of a reward error this module's scoring gave: not_finite, reward_range,
    not_a_number (a value of another type, or a batch of the wrong length), remote (a remote
    reward server's failure), judge (a judge model gave no score) or raised."""
    return next((kind for kind, text in _KINDS if text in error), "raised")


def _checked(reward: float, error: str,
             reward_range: tuple[float, float] | None) -> tuple[float, str]:
    if error:
        return 0.0, error
    # a NaN, infinite or huge reward would poison every advantage in its group
    if not math.isfinite(reward):
        return 0.0, f"ValueError: reward is not finite: {reward}"
    if reward_range is not None and not reward_range[0] <= reward <= reward_range[1]:
        return 0.0, (f"ValueError: reward {reward:g} is outside buffer.reward_range "
                     f"[{reward_range[0]:g}, {reward_range[1]:g}]")
    return reward, ""
