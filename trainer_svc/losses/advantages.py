"""Advantage estimators that need no value model, and reward shaping applied before them.

Every estimator maps per-sample rewards [B] and the index of each sample's group [B] (all
samples of one prompt share an index) to one advantage per sample [B]. GAE, which needs a
value model, lives in ppo.py.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from relayrl.config import ConfigError

ADVANTAGE_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp")
# Rewards reach the trainer through float32 arithmetic in places (engines, reward code), whose
# rounding is ~6e-8 of the value: a group whose rewards spread less than this share of their
# magnitude carries rounding, not signal, and is treated as uniform.
UNIFORM_RTOL = 1e-6


def is_uniform(rewards: torch.Tensor) -> bool:
    """Whether one group's rewards all agree, up to float rounding of their magnitude."""
    r = rewards.double()
    top, bottom = r.max(), r.min()
    return bool(top - bottom <= UNIFORM_RTOL * torch.maximum(top.abs(), bottom.abs()))


def group_advantages(rewards: torch.Tensor, scale: bool, eps: float = 1e-6) -> torch.Tensor:
    """GRPO, one group: reward minus the group mean, divided by the group's (sample) std if
    `scale`. In float64, so rewards near the float32 limit cannot overflow the mean or the
    std; exactly 0 for a uniform group, whose float mean need not equal its rewards."""
    r = rewards.double()
    if rewards.numel() < 2 or is_uniform(r):
        return torch.zeros_like(r)
    centered = r - r.mean()
    if not scale:
        return centered
    return centered / (r.std(unbiased=True) + eps)


def leave_one_out_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO, one group: reward minus the mean of the group's other rewards. A group of one has
    no other sample to compare with, so no signal; a uniform group none either."""
    r = rewards.double()
    n = r.numel()
    if n < 2 or is_uniform(r):
        return torch.zeros_like(r)
    others_mean = (r.sum() - r) / (n - 1)
    return r - others_mean


def per_group(rewards: torch.Tensor, group_ids: torch.Tensor,
              fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Apply a one-group estimator to every group; samples keep their positions."""
    out = torch.empty_like(rewards, dtype=torch.float64)
    for gid in torch.unique(group_ids):
        idx = (group_ids == gid).nonzero().flatten()
        out[idx] = fn(rewards[idx])
    return out


def reinforce_pp_advantages(rewards: torch.Tensor, group_ids: torch.Tensor,
                            eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ with a baseline: subtract the group mean, then normalise over the whole
    batch (mean 0, population std 1), so the scale no longer depends on one group's spread.
    A uniform group's samples stay exactly 0: the batch mean they would shift by is 0 but
    for rounding."""
    centered = per_group(rewards, group_ids, lambda r: group_advantages(r, scale=False))
    normalised = (centered - centered.mean()) / (centered.std(unbiased=False) + eps)
    return torch.where(centered == 0, torch.zeros_like(normalised), normalised)


def sequence_advantages(estimator: str, rewards: torch.Tensor, group_ids: torch.Tensor,
                        scale_rewards: bool) -> torch.Tensor:
    """One advantage per sample by the named estimator (see ADVANTAGE_ESTIMATORS), computed
    in float64 and returned in float32, the loss's precision."""
    rewards = rewards.double()
    if estimator == "grpo":
        out = per_group(rewards, group_ids, lambda r: group_advantages(r, scale_rewards))
    elif estimator == "dr_grpo":  # Dr. GRPO: no std scaling, whatever scale_rewards says
        out = per_group(rewards, group_ids, lambda r: group_advantages(r, scale=False))
    elif estimator == "rloo":
        out = per_group(rewards, group_ids, leave_one_out_advantages)
    elif estimator == "reinforce_pp":
        out = reinforce_pp_advantages(rewards, group_ids)
    else:
        raise ValueError(f"unknown advantage estimator {estimator!r}; known: "
                         f"{ADVANTAGE_ESTIMATORS}")
    return out.float()


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int,
                     factor: float) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the reward: 0 up to max_len - buffer tokens,
    then falling linearly to -factor at max_len, and -factor beyond."""
    if buffer <= 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    if buffer > max_len:
        raise ConfigError(f"trainer.loss.overlong_buffer ({buffer}) must be at most the response "
                         f"length cap rollout.max_new_tokens ({max_len})")
    over = (lengths.float() - (max_len - buffer)).clamp(min=0.0, max=float(buffer))
    return -factor * over / buffer
