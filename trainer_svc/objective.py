"""One batch's policy update: reward shaping, advantages, the configured loss, and the
models the loss needs beside the policy (a value head for PPO, a frozen reference for the
KL penalty), then `updates_per_batch` optimizer steps."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch

from relayrl.config import TrainerConfig
from trainer_svc.batching import PolicyOutputs, TrainBatch, policy_outputs
from trainer_svc.losses import LossInputs, LossSettings, get_loss
from trainer_svc.losses.advantages import overlong_penalty
from trainer_svc.losses.ppo import ValueHead


@dataclass
class UpdateResult:
    old_logprobs: torch.Tensor  # [B, T] under the policy before the update
    stats: dict[str, float]  # loss, grad_norm and the loss's own stats, of the last step


class Objective:
    def __init__(self, tc: TrainerConfig, model: torch.nn.Module, max_response_len: int,
                 temperature: float):
        self.loss = get_loss(tc.loss)
        self.settings = LossSettings.from_config(tc, max_response_len)
        self.updates = tc.updates_per_batch
        self.grad_clip = tc.grad_clip
        self.temperature = temperature
        self.max_response_len = max_response_len
        self.overlong_buffer = tc.overlong_buffer
        self.overlong_factor = tc.overlong_penalty
        if self.overlong_buffer > max_response_len:
            raise ValueError(f"trainer.overlong_buffer ({self.overlong_buffer}) must be at most "
                             f"rollout.max_new_tokens ({max_response_len})")
        self.value_head = (ValueHead(model.config.hidden_size) if self.loss.uses_value_model
                           else None)
        # The reference is the policy as the trainer first holds it: built before resume()
        # loads a checkpoint, it stays the initial weights across restarts.
        self.reference = _frozen_copy(model) if tc.kl_coef > 0 else None

    def parameters(self) -> list[torch.nn.Parameter]:
        """Trainable parameters beside the policy's, for the same optimizer."""
        return list(self.value_head.parameters()) if self.value_head is not None else []

    def state_dict(self) -> dict:
        return {"value_head": self.value_head.state_dict()} if self.value_head else {}

    def load_state_dict(self, state: dict) -> None:
        if self.value_head is not None:
            if "value_head" not in state:
                raise ValueError(f"trainer.loss {self.loss.name!r} needs a value head, and the "
                                 "checkpoint holds none (it was trained with another loss)")
            self.value_head.load_state_dict(state["value_head"])

    def shaped_rewards(self, tb: TrainBatch) -> torch.Tensor:
        return tb.rewards.float() + overlong_penalty(
            tb.response_lengths, self.max_response_len, self.overlong_buffer,
            self.overlong_factor)

    def _forward(self, model, tb: TrainBatch) -> tuple[PolicyOutputs, torch.Tensor | None]:
        out = policy_outputs(model, tb, self.temperature,
                             entropy_grad=self.settings.entropy_coef > 0,
                             hidden=self.value_head is not None)
        values = self.value_head(out.hidden) if self.value_head is not None else None
        return out, values

    def update(self, model, optimizer: torch.optim.Optimizer, tb: TrainBatch,
               before_first_step: Callable[[], None] = lambda: None) -> UpdateResult:
        """Take `updates_per_batch` optimizer steps on `tb`; `before_first_step` runs after
        the first backward pass, while the parameters are still the old ones."""
        rewards = self.shaped_rewards(tb)
        ref_logprobs = None
        if self.reference is not None:
            with torch.no_grad():
                ref_logprobs = policy_outputs(self.reference, tb, self.temperature).logprobs
        out, values = self._forward(model, tb)
        old_logprobs = out.logprobs.detach()
        old_values = values.detach() if values is not None else None
        advantages, returns = self.loss.advantages(rewards, tb.group_ids, tb.response_mask,
                                                   self.settings, old_values)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for i in range(self.updates):
            if i > 0:
                out, values = self._forward(model, tb)
            loss, stats = self.loss(LossInputs(
                out.logprobs, old_logprobs, tb.behaviour_logprobs, advantages,
                tb.response_mask, entropy=out.entropy, ref_logprobs=ref_logprobs,
                values=values, old_values=old_values, returns=returns), self.settings)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
            if i == 0:
                before_first_step()
            optimizer.step()
        stats = {"loss": loss.item(), "grad_norm": grad_norm.item(), **stats}
        if self.overlong_buffer:
            stats["reward_shaped_mean"] = rewards.mean().item()
        return UpdateResult(old_logprobs, stats)


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref
