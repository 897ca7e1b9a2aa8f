"""Off-policy corrections: what the objective's ratio is measured against, and how tokens
sampled by an older or different policy are weighted.

Three policies are in play. mu, the behaviour policy, sampled the tokens (the rollout engine,
possibly several versions behind; its log-probabilities travel with the sample). pi_old is
the trainer's policy before this batch's first update (the proximal policy). pi is the
policy being optimised.

  none       ratio pi/pi_old, clipped; no weight: mu is ignored.
  tis_token  ratio pi/pi_old, clipped; each token weighted by min(pi_old/mu, cap).
  tis_seq    ratio pi/pi_old, clipped; each sequence weighted by min(prod_t pi_old/mu, cap).
  aipo       ratio pi/mu itself, truncated one-sidedly at cap (no pi_old, no PPO clip).
  decoupled  decoupled PPO: ratio pi/pi_old, clipped; each token weighted by pi_old/mu,
             and tokens whose weight exceeds cap dropped rather than capped (as AReaL does),
             so tokens mu sampled far off the proximal policy do not steer the update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trainer_svc.losses.policy import bounded_exp, masked, masked_log_ratio, masked_mean

CORRECTIONS = ("none", "tis_token", "tis_seq", "aipo", "decoupled")


@dataclass
class Correction:
    log_ratio: torch.Tensor  # [B, T], with gradient: log(pi / pi_old), or log(pi / mu) (aipo)
    weight: torch.Tensor  # [B, T], no gradient: multiplies each token's objective term
    truncated: bool  # True: bound the ratio one-sidedly at the cap instead of the PPO clip
    stats: dict[str, float]


def correct(name: str, logprobs: torch.Tensor, old_logprobs: torch.Tensor,
            behaviour_logprobs: torch.Tensor, mask: torch.Tensor, cap: float) -> Correction:
    if name not in CORRECTIONS:
        raise ValueError(f"trainer.loss.correction: unknown correction {name!r}; known: "
                         f"{list(CORRECTIONS)}")
    with torch.no_grad():
        token_log_w = masked_log_ratio(old_logprobs, behaviour_logprobs, mask)
        token_w = bounded_exp(token_log_w)
        ones = torch.ones_like(token_w)
    if name == "aipo":
        log_ratio = masked_log_ratio(logprobs, behaviour_logprobs, mask)
        with torch.no_grad():
            ratio = bounded_exp(log_ratio)
        return Correction(log_ratio, ones, True, _token_stats(ratio, ratio > cap, mask))
    log_ratio = masked_log_ratio(logprobs, old_logprobs, mask)
    if name == "none":
        return Correction(log_ratio, ones, False,
                          _token_stats(token_w, torch.zeros_like(mask, dtype=torch.bool), mask))
    if name == "tis_token":
        weight = token_w.clamp(max=cap)
        return Correction(log_ratio, weight, False, _token_stats(token_w, token_w > cap, mask))
    if name == "decoupled":
        keep = token_w <= cap
        weight = torch.where(keep, token_w, torch.zeros_like(token_w))
        return Correction(log_ratio, weight, False, _token_stats(token_w, ~keep, mask))
    # tis_seq: the product of token weights is a sum in log space; cap it there so a long
    # sequence cannot overflow
    with torch.no_grad():
        seq_log_w = token_log_w.sum(-1)
        seq_w = bounded_exp(seq_log_w.clamp(max=math.log(cap)))
        weight = seq_w[:, None].expand_as(token_w)
        has_tokens = mask.sum(-1) > 0
        raw = bounded_exp(seq_log_w)
        stats = {
            "is_weight_mean": raw[has_tokens].mean().item() if has_tokens.any() else 1.0,
            "is_weight_max": raw[has_tokens].max().item() if has_tokens.any() else 1.0,
            "is_truncated_frac": (raw[has_tokens] > cap).float().mean().item()
            if has_tokens.any() else 0.0,
        }
    return Correction(log_ratio, weight, False, stats)


@torch.no_grad()
def _token_stats(weight: torch.Tensor, truncated: torch.Tensor,
                 mask: torch.Tensor) -> dict[str, float]:
    """Mean and max of the raw (uncapped) weights over response tokens, and the share of
    them capped or dropped."""
    return {
        "is_weight_mean": masked_mean(weight, mask).item(),
        "is_weight_max": masked(weight, mask).max().item(),
        "is_truncated_frac": masked_mean(truncated.float(), mask).item(),
    }
