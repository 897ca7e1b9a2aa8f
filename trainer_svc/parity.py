"""How far the sampling engine's log-probabilities sit from the trainer's, every step.

Two views of the same tokens. Tokens sampled by the version the trainer holds now measure the
engine itself (kernels, dtype, sampler): on identical weights the gap should be ~0, and a
growing one means the engine and trainer disagree about the policy. All policy tokens
together measure what the importance-sampling correction has to undo (engine gap plus
staleness). The KL estimate is k3 = r - 1 - log r with r = pi/mu, unbiased for KL(mu || pi)
on tokens sampled from mu, and never negative.
"""

from __future__ import annotations

import torch


def _gap(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor):
    n = mask.sum()
    log_ratio = (trainer_logp - engine_logp) * mask
    k3 = (torch.exp(log_ratio) - 1.0 - log_ratio) * mask
    return (log_ratio.abs().sum() / n).item(), (k3.sum() / n).item(), int(n.item())


@torch.no_grad()
def logprob_gaps(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                 token_versions: torch.Tensor, version: int) -> dict[str, float]:
    """All [B, T] tensors aligned on next-token positions; `mask` 1.0 on policy tokens;
    `token_versions` the version that sampled each token. Keys with no tokens are left out."""
    out: dict[str, float] = {}
    mask = mask.float()
    if mask.sum() == 0:
        return out
    absdiff, kl, _ = _gap(trainer_logp, engine_logp, mask)
    out["rollout/offpolicy_logp_absdiff"] = absdiff
    out["rollout/offpolicy_kl"] = kl
    same = mask * (token_versions == version).float()
    out["rollout/engine_tokens_frac"] = (same.sum() / mask.sum()).item()
    if same.sum() > 0:
        absdiff, kl, _ = _gap(trainer_logp, engine_logp, same)
        out["rollout/engine_logp_absdiff"] = absdiff
        out["rollout/engine_kl"] = kl
    return out
