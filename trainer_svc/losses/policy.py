"""The policy-gradient objective: importance ratios at token or sequence level, the clipped
and truncated surrogates, and how per-token terms are reduced to one number.

Every tensor is [B, T] on next-token positions, with `mask` 1.0 on the response tokens the
model produced. Values at masked positions are never read: they are replaced by zeros
before any arithmetic, so garbage there (even inf or nan) cannot leak into the loss or its
gradient.
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]
RatioLevel = Literal["token", "sequence"]


def masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask > 0, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked(x, mask).sum() / mask.sum().clamp(min=1.0)


def seq_mean_token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    per_seq = masked(x, mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_seq.mean()


def aggregate(x: torch.Tensor, mask: torch.Tensor, mode: Aggregation,
              max_len: int | None = None) -> torch.Tensor:
    """seq_mean_token_mean: each sequence's token mean, then the mean over sequences (GRPO);
    token_mean: every token in the batch weighs the same (DAPO, PPO);
    seq_mean_token_sum_norm: each sequence's token sum over a constant `max_len`, then the
    mean over sequences (Dr. GRPO: no bias from a sequence's own length)."""
    if mode == "seq_mean_token_mean":
        return seq_mean_token_mean(x, mask)
    if mode == "token_mean":
        return masked_mean(x, mask)
    if mode == "seq_mean_token_sum_norm":
        if not max_len or max_len < 1:
            raise ValueError("seq_mean_token_sum_norm needs a constant max_len >= 1")
        return (masked(x, mask).sum(-1) / max_len).mean()
    raise ValueError(f"unknown aggregation {mode!r}")


def masked_log_ratio(logprobs: torch.Tensor, base: torch.Tensor,
                     mask: torch.Tensor) -> torch.Tensor:
    """log(pi / base) on response tokens, 0 elsewhere; gradient flows through `logprobs`."""
    return masked(logprobs - base, mask)


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's length-normalised sequence log-ratio: the mean token log-ratio, [B]."""
    return masked(log_ratio, mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def ratio_at_level(log_ratio: torch.Tensor, mask: torch.Tensor, level: RatioLevel):
    """Per-token ratios [B, T]. At sequence level (GSPO-token) every token carries the value
    of its sequence's ratio s = exp(mean log-ratio), and the gradient reaching token t is
    s * dlog pi_t, so a token-mean over the sequence has exactly the gradient of s itself."""
    if level == "token":
        return torch.exp(log_ratio)
    if level != "sequence":
        raise ValueError(f"unknown ratio level {level!r}")
    seq = sequence_log_ratio(log_ratio, mask).detach()[:, None]
    return torch.exp(seq + log_ratio - log_ratio.detach())


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float):
    """PPO's pessimistic clipped objective as a per-token loss, max(-A r, -A clip(r)), and
    where r lies outside [low, high]. The clip stops the gradient only where it binds: r too
    high with A > 0, or too low with A < 0."""
    clipped = ratio.clamp(low, high)
    loss = torch.maximum(-adv * ratio, -adv * clipped)
    return loss, (ratio < low) | (ratio > high)


def truncated_surrogate(ratio: torch.Tensor, adv: torch.Tensor, cap: float):
    """AIPO's one-sided objective as a per-token loss, -A min(r, cap), and where r > cap:
    above the cap the term is constant, whatever the sign of A."""
    return -adv * ratio.clamp(max=cap), ratio > cap


def per_token_advantages(adv: torch.Tensor) -> torch.Tensor:
    """[B] (one per sequence) or [B, T] (one per token) as something that broadcasts on
    [B, T]."""
    return adv if adv.dim() == 2 else adv[:, None]
