"""PPO's critic side: a value head, terminal rewards, GAE, and the clipped value loss.

Values live on next-token positions like everything else: the value at position t is the
critic's estimate in the state that emits token t + 1, so it lines up with that token's
log-probability and mask. The trajectory is the sequence of response tokens the model
produced (mask 1.0); tokens it did not produce (tool output, padding) are not steps: GAE
passes over them, carrying the next step's value and advantage across.
"""

from __future__ import annotations

import torch
from torch import nn

from trainer_svc.losses.policy import masked, masked_mean


class ValueHead(nn.Module):
    """A linear critic on the policy's last hidden state. Starts at zero, so the first
    advantages are plain returns and no random baseline is injected."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.float()).squeeze(-1)


def terminal_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] sequence rewards placed on each sequence's last produced token, [B, T]."""
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(-1).values
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = (last >= 0).nonzero().flatten()
    out[rows, last[rows]] = rewards[rows].float()
    return out


@torch.no_grad()
def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
        gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over produced tokens: (advantages, returns), [B, T],
    0 off the mask. The value after the last produced token is 0 (the episode ends)."""
    b, t_len = mask.shape
    adv = torch.zeros((b, t_len), dtype=torch.float32, device=mask.device)
    next_value = torch.zeros(b, dtype=torch.float32, device=mask.device)
    next_adv = torch.zeros(b, dtype=torch.float32, device=mask.device)
    for t in reversed(range(t_len)):
        step = mask[:, t] > 0
        value = torch.where(step, values[:, t].float(), next_value)
        delta = token_rewards[:, t] + gamma * next_value - value
        a = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(step, a, torch.zeros_like(a))
        next_value = value
        next_adv = torch.where(step, a, next_adv)
    returns = masked(adv + values.float(), mask)
    return adv, returns


@torch.no_grad()
def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Mean 0, std 1 over produced tokens; 0 elsewhere. In float64, so returns near the
    float32 limit cannot overflow the variance; returned in x's dtype."""
    x64 = x.double()
    mean = masked_mean(x64, mask)
    var = masked_mean((x64 - mean) ** 2, mask)
    return masked((x64 - mean) / (var.sqrt() + eps), mask).to(x.dtype)


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token 0.5 * max((V - R)^2, (V_clip - R)^2), where V_clip stays within `clip` of the
    values before this batch's updates; and where the clipped term is the larger."""
    v_clipped = old_values + (values - old_values).clamp(-clip, clip)
    plain = (values - returns) ** 2
    clipped = (v_clipped - returns) ** 2
    return 0.5 * torch.maximum(plain, clipped), clipped > plain
