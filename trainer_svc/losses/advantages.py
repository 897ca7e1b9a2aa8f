"""Advantage estimators that need no value model, and reward shaping applied before them.

Every estimator maps per-sample rewards [B] and the index of each sample's group [B] (all
samples of one prompt share an index) to one advantage per sample [B]. GAE, which needs a
value model, lives in ppo.py.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ADVANTAGE_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp")


def group_advantages(rewards: torch.Tensor, scale: bool, eps: float = 1e-6) -> torch.Tensor:
    """GRPO, one group: reward minus the group mean, divided by the group's (sample) std if
    `scale`."""
    centered = rewards - rewards.mean()
    if not scale or rewards.numel() < 2:
        return centered
    return centered / (rewards.std(unbiased=True) + eps)


def leave_one_out_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO, one group: reward minus the mean of the group's other rewards. A group of one has
    no other sample to compare with, so no signal."""
    n = rewards.numel()
    if n < 2:
        return torch.zeros_like(rewards)
    others_mean = (rewards.sum() - rewards) / (n - 1)
    return rewards - others_mean


def per_group(rewards: torch.Tensor, group_ids: torch.Tensor,
              fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Apply a one-group estimator to every group; samples keep their positions."""
    out = torch.empty_like(rewards)
    for gid in torch.unique(group_ids):
        idx = (group_ids == gid).nonzero().flatten()
        out[idx] = fn(rewards[idx])
    return out


def reinforce_pp_advantages(rewards: torch.Tensor, group_ids: torch.Tensor,
                            eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ with a baseline: subtract the group mean, then normalise over the whole
    batch (mean 0, population std 1), so the scale no longer depends on one group's spread."""
    centered = per_group(rewards, group_ids, lambda r: r - r.mean())
    return (centered - centered.mean()) / (centered.std(unbiased=False) + eps)


def sequence_advantages(estimator: str, rewards: torch.Tensor, group_ids: torch.Tensor,
                        scale_rewards: bool) -> torch.Tensor:
    """One advantage per sample by the named estimator (see ADVANTAGE_ESTIMATORS)."""
    rewards = rewards.float()
    if estimator == "grpo":
        return per_group(rewards, group_ids, lambda r: group_advantages(r, scale_rewards))
    if estimator == "dr_grpo":  # Dr. GRPO: no std scaling, whatever scale_rewards says
        return per_group(rewards, group_ids, lambda r: group_advantages(r, scale=False))
    if estimator == "rloo":
        return per_group(rewards, group_ids, leave_one_out_advantages)
    if estimator == "reinforce_pp":
        return reinforce_pp_advantages(rewards, group_ids)
    raise ValueError(f"unknown advantage estimator {estimator!r}; known: {ADVANTAGE_ESTIMATORS}")


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int,
                     factor: float) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the reward: 0 up to max_len - buffer tokens,
    then falling linearly to -factor at max_len, and -factor beyond."""
    if buffer <= 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    if buffer > max_len:
        raise ValueError(f"trainer.overlong_buffer ({buffer}) must be at most the response "
                         f"length cap rollout.max_new_tokens ({max_len})")
    over = (lengths.float() - (max_len - buffer)).clamp(min=0.0, max=float(buffer))
    return -factor * over / buffer
