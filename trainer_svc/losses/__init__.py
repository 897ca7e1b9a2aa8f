"""Policy losses by name (`trainer.loss.name`), each a recipe of independent parts:

  an advantage estimator   advantages.py (group baselines), ppo.py (GAE on a value head)
  an off-policy correction corrections.py (`trainer.loss.correction`)
  a surrogate objective    policy.py: PPO-clipped or truncated, token- or sequence-level ratio
  an aggregation           policy.py: how per-token terms become one number
  regularisers             regularizers.py: KL to a frozen reference, entropy bonus

Every loss takes per-token tensors [B, T] on next-token positions and a mask of the response
tokens the model produced, and returns (scalar loss, stats). A recipe's settings are its
config model (relayrl/config/loss.py), passed to every call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from relayrl.config.loss import DapoLoss, LossConfig, loss_config
from trainer_svc.losses.advantages import group_advantages, sequence_advantages
from trainer_svc.losses.corrections import CORRECTIONS, correct
from trainer_svc.losses.policy import (
    Aggregation,
    RatioLevel,
    aggregate,
    clipped_surrogate,
    log_ratio_at_level,
    masked,
    masked_mean,
    per_token_advantages,
    ratio_at_level,
    seq_mean_token_mean,
    truncated_surrogate,
)
from trainer_svc.losses.ppo import clipped_value_loss, gae, terminal_rewards, whiten
from trainer_svc.losses.regularizers import kl_per_token

__all__ = ["CORRECTIONS", "LOSSES", "LossInputs", "PolicyLoss", "get_loss", "group_advantages",
           "grpo_loss", "masked_mean", "seq_mean_token_mean"]


@dataclass(frozen=True)
class LossInputs:
    logprobs: torch.Tensor  # current policy, with grad
    old_logprobs: torch.Tensor  # policy before this batch's first update, no grad
    behaviour_logprobs: torch.Tensor  # the sampling policy's, as recorded by the worker
    advantages: torch.Tensor  # per sequence [B] or per token [B, T]
    mask: torch.Tensor  # 1.0 on response tokens the model produced
    entropy: torch.Tensor | None = None  # [B, T] of the current policy; bonus and metric
    ref_logprobs: torch.Tensor | None = None  # frozen reference policy; KL penalty and metric
    values: torch.Tensor | None = None  # [B, T] critic, with grad (losses with a value model)
    old_values: torch.Tensor | None = None  # critic before this batch's first update
    returns: torch.Tensor | None = None  # [B, T] value targets


@dataclass(frozen=True)
class PolicyLoss:
    name: str
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"]
    ratio_level: RatioLevel
    aggregation: Aggregation
    filters_uniform_groups: bool = False  # DAPO's dynamic sampling
    uses_value_model: bool = False

    @staticmethod
    def clip_range(s: LossConfig) -> tuple[float, float]:
        """dapo clips higher above than below; every other recipe by clip_eps both ways (gspo
        its sequence ratio)."""
        if isinstance(s, DapoLoss):
            return 1.0 - s.clip_eps_low, 1.0 + s.clip_eps_high
        return 1.0 - s.clip_eps, 1.0 + s.clip_eps

    def advantages(self, rewards: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor,
                   s: LossConfig, values: torch.Tensor | None = None):
        """(advantages [B] or [B, T], returns [B, T] or None). GAE needs `values`."""
        assert s.name == self.name, (s.name, self.name)
        if self.advantage != "gae":
            return sequence_advantages(self.advantage, rewards, group_ids,
                                       s.scales_by_group_std), None
        if values is None:
            raise ValueError(f"loss {self.name!r} needs the value model's values")
        adv, returns = gae(terminal_rewards(rewards, mask), values, mask, s.gamma, s.gae_lambda)
        return whiten(adv, mask), returns

    def __call__(self, inp: LossInputs, s: LossConfig, max_response_len: int | None = None
                 ) -> tuple[torch.Tensor, dict[str, float]]:
        """`max_response_len` is rollout.max_new_tokens, dr_grpo's constant normaliser."""
        assert s.name == self.name, (s.name, self.name)
        mask = inp.mask
        corr = correct(s.correction, inp.logprobs, inp.old_logprobs, inp.behaviour_logprobs,
                       mask, s.tis_cap)
        adv = per_token_advantages(inp.advantages)
        if corr.truncated:
            per_token, clipped = truncated_surrogate(
                log_ratio_at_level(corr.log_ratio, mask, self.ratio_level), adv, s.tis_cap)
        else:
            ratio = ratio_at_level(corr.log_ratio, mask, self.ratio_level)
            per_token, clipped = clipped_surrogate(ratio, adv, *self.clip_range(s))

        def reduce(x: torch.Tensor) -> torch.Tensor:
            return aggregate(x, mask, self.aggregation, max_response_len)

        policy_loss = reduce(per_token * corr.weight)
        loss = policy_loss
        stats = {"policy_loss": policy_loss.item(),
                 "clip_frac": masked_mean(clipped.float(), mask).item(), **corr.stats}
        if inp.ref_logprobs is not None:
            kl = kl_per_token(inp.logprobs, inp.ref_logprobs, mask, s.kl_estimator)
            stats["kl_ref"] = masked_mean(kl.detach(), mask).item()
            if s.kl_coef > 0:
                loss = loss + s.kl_coef * reduce(kl)
        if inp.entropy is not None:
            stats["entropy"] = masked_mean(inp.entropy.detach(), mask).item()
            if s.entropy_coef > 0:
                loss = loss - s.entropy_coef * reduce(inp.entropy)
        if self.uses_value_model:
            if inp.values is None or inp.old_values is None or inp.returns is None:
                raise ValueError(f"loss {self.name!r} needs values, old_values and returns")
            per_token_v, v_clipped = clipped_value_loss(
                masked(inp.values, mask), masked(inp.old_values, mask),
                masked(inp.returns, mask), s.value_clip)
            value_loss = masked_mean(per_token_v, mask)
            loss = loss + s.value_coef * value_loss
            stats["value_loss"] = value_loss.item()
            stats["value_clip_frac"] = masked_mean(v_clipped.float(), mask).item()
        return loss, stats


LOSSES: dict[str, PolicyLoss] = {p.name: p for p in (
    PolicyLoss("grpo", "grpo", "token", "seq_mean_token_mean"),
    PolicyLoss("dr_grpo", "dr_grpo", "token", "seq_mean_token_sum_norm"),
    PolicyLoss("dapo", "grpo", "token", "token_mean", filters_uniform_groups=True),
    PolicyLoss("rloo", "rloo", "token", "seq_mean_token_mean"),
    PolicyLoss("reinforce_pp", "reinforce_pp", "token", "token_mean"),
    PolicyLoss("gspo", "grpo", "sequence", "seq_mean_token_mean"),
    PolicyLoss("ppo", "gae", "token", "token_mean", uses_value_model=True),
)}


def get_loss(name: str) -> PolicyLoss:
    if name not in LOSSES:
        raise ValueError(f"trainer.loss.name: unknown loss {name!r}; known: {sorted(LOSSES)}")
    return LOSSES[name]


def grpo_loss(inp: LossInputs, clip_eps: float, tis_cap: float):
    """GRPO with token-level truncated importance sampling."""
    return LOSSES["grpo"](inp, loss_config("grpo", clip_eps=clip_eps, tis_cap=tis_cap))
