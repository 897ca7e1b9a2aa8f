"""Regularisers added to the policy loss: KL to a frozen reference policy, and entropy.

KL(pi || ref) is estimated per token from log-probabilities of the sampled tokens, with
Schulman's estimators (http://joschu.net/blog/kl-approx.html), x = log(ref / pi):
  k1 = -x               unbiased, high variance, can be negative
  k2 = x^2 / 2          biased, low variance, never negative
  k3 = (e^x - 1) - x    unbiased, low variance, never negative
All three are zero where pi and ref agree.
"""

from __future__ import annotations

import torch

from trainer_svc.losses.policy import LOG_RATIO_BOUND, masked

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_per_token(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor,
                 estimator: str) -> torch.Tensor:
    """[B, T] estimate of KL(pi || ref) at each response token, 0 elsewhere; gradient flows
    through `logprobs`."""
    x = masked(ref_logprobs - logprobs, mask)
    if estimator == "k1":
        return -x
    if estimator == "k2":
        return 0.5 * x * x
    if estimator == "k3":
        # expm1 keeps the small-difference case accurate; the clamp only absorbs rounding.
        # x is bounded before exp like every log-ratio (policy.LOG_RATIO_BOUND).
        x = x.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        return (torch.expm1(x) - x).clamp(min=0.0)
    raise ValueError(f"trainer.loss.kl_estimator: unknown estimator {estimator!r}; known: "
                     f"{list(KL_ESTIMATORS)}")


def entropy_from_logprobs(logp: torch.Tensor) -> torch.Tensor:
    """Entropy of each next-token distribution, [..., V] log-probabilities -> [...]."""
    return -(logp.exp() * logp).sum(-1)
