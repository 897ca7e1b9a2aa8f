"""The policy-gradient objective: importance ratios at token or sequence level, the clipped
and truncated surrogates, and how per-token terms are reduced to one number.

Every tensor is [B, T] on next-token positions, with `mask` 1.0 on the response tokens the
model produced. Values at masked positions are never read: they are replaced by zeros
before any arithmetic, so garbage there (even inf or nan) cannot leak into the loss or its
gradient.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

Aggregation = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]
RatioLevel = Literal["token", "sequence"]
# Every log-ratio is clamped to +-LOG_RATIO_BOUND before it is exponentiated. exp(20) ~ 5e8
# is far past any clip range or importance-weight cap in use (around 1 to 10), so the bound
# changes no value an objective can use; yet a ratio of that size times an advantage, summed
# over millions of tokens, stays well inside float32, where exp(89) alone is already inf.
# Past the bound the ratio is constant, so such a token passes no gradient through it.
LOG_RATIO_BOUND = 20.0


def bounded_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp of a log-ratio clamped to +-LOG_RATIO_BOUND."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))


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


def log_ratio_at_level(log_ratio: torch.Tensor, mask: torch.Tensor,
                       level: RatioLevel) -> torch.Tensor:
    """Per-token log-ratios [B, T] at `level`. At sequence level (GSPO-token) every token
    carries its sequence's mean log-ratio in value, and its own log-ratio's gradient."""
    if level == "token":
        return log_ratio
    if level != "sequence":
        raise ValueError(f"unknown ratio level {level!r}")
    seq = sequence_log_ratio(log_ratio, mask).detach()[:, None]
    return seq + (log_ratio - log_ratio.detach())


def ratio_at_level(log_ratio: torch.Tensor, mask: torch.Tensor, level: RatioLevel):
    """Per-token ratios [B, T]. At sequence level (GSPO-token) every token carries the value
    of its sequence's ratio s = exp(mean log-ratio), and the gradient reaching token t is
    s * dlog pi_t, so a token-mean over the sequence has exactly the gradient of s itself."""
    at_level = log_ratio_at_level(log_ratio, mask, level)
    if level == "token":
        return bounded_exp(at_level)
    # the bound on the value only: the gradient s * dlog pi_t keeps flowing
    return bounded_exp(at_level.detach()) * torch.exp(at_level - at_level.detach())


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float):
    """PPO's pessimistic clipped objective as a per-token loss, max(-A r, -A clip(r)), and
    where r lies outside [low, high]. The clip stops the gradient only where it binds: r too
    high with A > 0, or too low with A < 0."""
    clipped = ratio.clamp(low, high)
    loss = torch.maximum(-adv * ratio, -adv * clipped)
    return loss, (ratio < low) | (ratio > high)


def truncated_surrogate(log_ratio: torch.Tensor, adv: torch.Tensor, cap: float):
    """AIPO's (LlamaRL's) one-sided objective as a per-token loss, from the log-ratios at
    their level (log_ratio_at_level), and where r > cap. Its update is
    min(r, cap) A grad log pi: the weight w = min(r, cap) carries no gradient, so above the
    cap a token still pulls with cap A rather than not at all. The term is
    -sg(w) A exp(log r - sg(log r)): its value is -A w, the truncated surrogate; its gradient
    -w A grad log r, with grad log r = grad log pi at token and sequence level alike."""
    bounded = log_ratio.detach().clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    weight = torch.exp(bounded).clamp(max=cap)
    return -adv * weight * torch.exp(log_ratio - log_ratio.detach()), bounded > math.log(cap)


def per_token_advantages(adv: torch.Tensor) -> torch.Tensor:
    """[B] (one per sequence) or [B, T] (one per token) as something that broadcasts on
    [B, T]."""
    return adv if adv.dim() == 2 else adv[:, None]
