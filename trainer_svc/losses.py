"""Policy losses by name, and the advantage estimators they use.

Every loss takes per-token tensors of shape [B, T] and a mask of response tokens, and
returns (scalar loss, stats). The off-policy correction is truncated importance sampling:
tokens are weighted by min(pi_old / mu, cap), where mu is the behaviour policy that sampled
them (the rollout engine, possibly several versions behind) and pi_old the trainer's policy
before this step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, scale: bool, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: reward minus the group mean, divided by the group's (sample) std if `scale`."""
    centered = rewards - rewards.mean()
    if not scale or rewards.numel() < 2:
        return centered
    return centered / (rewards.std(unbiased=True) + eps)


@dataclass(frozen=True)
class LossInputs:
    logprobs: torch.Tensor  # current policy, with grad
    old_logprobs: torch.Tensor  # policy before this step, no grad
    behaviour_logprobs: torch.Tensor  # the sampling policy's, as recorded by the worker
    advantages: torch.Tensor  # per sequence [B] or per token [B, T]
    mask: torch.Tensor  # 1.0 on response tokens the model produced


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def seq_mean_token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    per_seq = (x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_seq.mean()


def grpo_loss(inp: LossInputs, clip_eps: float, tis_cap: float):
    adv = inp.advantages if inp.advantages.dim() == 2 else inp.advantages[:, None]
    ratio = torch.exp(inp.logprobs - inp.old_logprobs)
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = torch.maximum(-adv * ratio, -adv * clipped)
    raw_is = torch.exp(inp.old_logprobs - inp.behaviour_logprobs).detach()
    tis = torch.clamp(raw_is, max=tis_cap)
    loss = seq_mean_token_mean(per_token * tis, inp.mask)
    with torch.no_grad():
        stats = {
            "clip_frac": masked_mean(((ratio - clipped).abs() > 0).float(), inp.mask).item(),
            "is_weight_mean": masked_mean(raw_is, inp.mask).item(),
            "is_weight_max": (raw_is * inp.mask).max().item(),
            "is_truncated_frac": masked_mean((raw_is > tis_cap).float(), inp.mask).item(),
        }
    return loss, stats


LossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
LOSSES: dict[str, LossFn] = {"grpo": grpo_loss}


def get_loss(name: str) -> LossFn:
    if name not in LOSSES:
        raise ValueError(f"trainer.loss: unknown loss {name!r}; known: {sorted(LOSSES)}")
    return LOSSES[name]
