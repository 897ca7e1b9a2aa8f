"""One batch's policy update: reward shaping, advantages, the configured loss, and the
models the loss needs beside the policy (a value head for PPO, a frozen reference for the
KL penalty), then `updates_per_batch` optimizer steps. Under torchrun every rank runs it on
the same whole batch and passes forward and backward over its own share of the groups
(trainer_svc.distributed explains the loss scaling). Batches arrive on the CPU and are moved
to the trainer's device here; forward passes run under its precision policy
(trainer_svc.precision)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from relayrl.config import ConfigError, TrainerConfig
from trainer_svc.batching import PolicyOutputs, TrainBatch, policy_outputs, select_rows
from trainer_svc.distributed import Parallel, normaliser, shard_rows
from trainer_svc.losses import LossInputs, get_loss
from trainer_svc.losses.advantages import overlong_penalty
from trainer_svc.losses.ppo import ValueHead
from trainer_svc.micro_batches import (
    MicroBatch,
    assemble,
    combine_stats,
    idle_part,
    split_batch,
)
from trainer_svc.packing import packed_outputs, packs_correctly, varlen
from trainer_svc.precision import resolve_precision
from trainer_svc.shared_prefix import prompt_sharing, shared_prefix_outputs


@dataclass
class UpdateResult:
    old_logprobs: torch.Tensor  # [B, T] under the policy before the update, on the CPU
    stats: dict[str, float]  # loss, grad_norm and the loss's own stats, of the last step
    # an optimizer step was skipped: its loss or gradient norm was not finite (the batch's
    # remaining steps with it; earlier ones, all finite, stand)
    nonfinite: bool = False


@dataclass
class RankShare:
    """The rows of the batch one rank passes forward and backward, and its part of the
    loss's normaliser. A rank left without groups runs row 0 with a weight of 0, so that it
    still joins every collective."""

    rows: torch.Tensor
    weight: float
    owns_rows: bool


class Objective:
    def __init__(self, tc: TrainerConfig, model: torch.nn.Module, max_response_len: int,
                 temperature: float, parallel: Parallel | None = None,
                 model_dir: Path | None = None):
        """`model` not yet sharded: the reference is a copy of it, sharded on its own. A
        `model` on the meta device (under torchrun) reads its weights from `model_dir`, and
        so does the reference."""
        self.parallel = parallel or Parallel()
        self.precision = resolve_precision(tc.precision, self.parallel.device)
        self.loss = get_loss(tc.loss.name)
        self.settings = tc.loss
        self.updates = tc.updates_per_batch
        # a value loss is a token mean: parts' weights fit it only under the same aggregation
        splittable = not (self.loss.uses_value_model and self.loss.aggregation != "token_mean")
        self.micro_batch_tokens = tc.micro_batch_tokens if splittable else 0
        self.grad_clip = tc.optimizer.grad_clip
        # checkpointed layers return no keys and values for the response pass to reuse
        self.shared_prefix = tc.shared_prefix and not tc.activation_checkpointing
        # rows that run whole are packed: the shared-prefix pass lays rows out its own way
        # (each prompt once, responses against its cache), which packing cannot share
        self.packing = tc.packing and not self.shared_prefix
        self.temperature = temperature
        self.max_response_len = max_response_len
        self.overlong_buffer = tc.loss.overlong_buffer
        self.overlong_factor = tc.loss.overlong_penalty
        if self.overlong_buffer > max_response_len:
            raise ConfigError(f"trainer.loss.overlong_buffer ({self.overlong_buffer}) must be "
                             f"at most rollout.max_new_tokens ({max_response_len})")
        self.value_head = (ValueHead(model.config.hidden_size) if self.loss.uses_value_model
                           else None)
        # The reference is the policy as the trainer first holds it: built before resume()
        # loads a checkpoint, it stays the initial weights across restarts. With a LoRA
        # adapter it is the base model itself, the adapter switched off: no second copy.
        self.reference_is_base = tc.loss.kl_coef > 0 and tc.lora is not None
        self.reference = (_frozen_copy(model) if tc.loss.kl_coef > 0 and tc.lora is None
                          else None)
        if self.parallel.active and self.loss.uses_value_model \
                and self.loss.aggregation != "token_mean":
            # the value loss is a token mean: one scale fits both terms only then
            raise ConfigError(f"loss {self.loss.name!r}: a value model with aggregation "
                             f"{self.loss.aggregation!r} cannot be split over ranks")
        if self.value_head is not None:
            self.parallel.shard(self.value_head, self.precision)
        if self.reference is not None:
            self.parallel.shard(self.reference, self.precision, model_dir)

    def parameters(self) -> list[torch.nn.Parameter]:
        """Trainable parameters beside the policy's, for the same optimizer."""
        return list(self.value_head.parameters()) if self.value_head is not None else []

    def state_dict(self) -> dict:
        """Whole on rank 0; every rank must call it."""
        if self.value_head is None:
            return {}
        return {"value_head": self.parallel.full_state_dict(self.value_head)}

    def load_state_dict(self, state: dict) -> None:
        if self.value_head is not None:
            if "value_head" not in state:
                raise ConfigError(f"trainer.loss.name {self.loss.name!r} needs a value head, and "
                                 "the checkpoint holds none (it was trained with another loss)")
            self.parallel.load_full_state_dict(self.value_head, state["value_head"])

    def shaped_rewards(self, tb: TrainBatch) -> torch.Tensor:
        """[B] float64: the estimators' group statistics run in float64 (losses.advantages)."""
        return tb.rewards.double() + overlong_penalty(
            tb.response_lengths, self.max_response_len, self.overlong_buffer,
            self.overlong_factor)

    def _outputs(self, model, part: MicroBatch, **kw) -> PolicyOutputs:
        tb = part.batch
        with self.precision.autocast():
            if part.packing is not None:
                return packed_outputs(model, tb, self.temperature, part.packing, **kw)
            if not self.shared_prefix:
                return policy_outputs(model, tb, self.temperature, **kw)
            return shared_prefix_outputs(model, tb, self.temperature, prompt_sharing(tb), **kw)

    def _forward(self, model, part: MicroBatch) -> tuple[PolicyOutputs, torch.Tensor | None]:
        out = self._outputs(model, part, entropy_grad=self.settings.entropy_coef > 0,
                            hidden=self.value_head is not None)
        if self.value_head is None:
            return out, None
        with self.precision.autocast():
            values = self.value_head(out.hidden)
        return out, values.float()  # the value loss compares them with float returns

    def rank_share(self, tb: TrainBatch) -> RankShare:
        world = self.parallel.world
        rows = shard_rows(tb.group_ids, world.rank, world.size)
        if len(rows) == 0:
            return RankShare(torch.zeros(1, dtype=torch.long), 0.0, False)
        agg = self.loss.aggregation
        whole = normaliser(agg, tb.response_mask).clamp(min=1.0)
        return RankShare(rows, (normaliser(agg, tb.response_mask[rows]) / whole).item(), True)

    def _whole_batch(self, local: torch.Tensor, share: RankShare, size: int) -> torch.Tensor:
        """Every rank's rows of a per-row tensor, assembled on every rank (on the CPU)."""
        if not self.parallel.active:
            return local.cpu()
        out = torch.zeros((size, *local.shape[1:]), dtype=local.dtype)
        if share.owns_rows:
            out[share.rows] = local.detach().cpu()
        return self.parallel.sum(out)

    def update(self, model, optimizer: torch.optim.Optimizer, tb: TrainBatch,
               before_first_step: Callable[[], None] = lambda: None) -> UpdateResult:
        """Take `updates_per_batch` optimizer steps on `tb`; `before_first_step` runs after
        the first backward pass, while the parameters are still the old ones. Under torchrun
        every rank passes the same whole `tb`, and the result is the whole batch's. Each
        step passes the rows in parts of like length (trainer_svc.micro_batches)."""
        rewards = self.shaped_rewards(tb)
        size = tb.rewards.shape[0]
        device = self.parallel.device
        share = self.rank_share(tb) if self.parallel.active else RankShare(
            torch.arange(size), 1.0, True)
        local = select_rows(tb, share.rows, device) if self.parallel.active else tb.to(device)
        packed = self.packing and packs_correctly(model)
        parts = split_batch(local, self.micro_batch_tokens, self.loss.aggregation,
                            self.shared_prefix, packed, packed and varlen(model))
        real = len(parts)
        if self.parallel.active:  # FSDP gathers weights in every pass: ranks pass alike
            count = int(self.parallel.max(torch.tensor([len(parts)])).item())
            parts += [idle_part(parts[-1])] * (count - len(parts))
        ref_logprobs = [self._reference_logprobs(model, p) for p in parts]
        # GAE needs every row's value before any loss: those passes serve the first step too
        first = [self._forward(model, p) for p in parts] if self.value_head else None
        old_values = None if first is None else assemble(
            parts[:real], [v.detach() for _, v in first[:real]], local.response_mask)
        # on the whole batch, as one process would: some estimators normalise over it
        advantages, returns = self.loss.advantages(
            rewards, tb.group_ids, tb.response_mask, self.settings,
            None if old_values is None else self._whole_batch(old_values, share, size))
        advantages = advantages[share.rows].to(device)
        returns = None if returns is None else returns[share.rows].to(device)
        # gradients are averaged over the ranks: see trainer_svc.distributed
        scale = self.parallel.world.size * share.weight if self.parallel.active else 1.0
        params = [p for group in optimizer.param_groups for p in group["params"]]
        old_logprobs: list = [None] * len(parts)
        old_part_values: list = [None] * len(parts)
        nonfinite = False
        for i in range(self.updates):
            optimizer.zero_grad(set_to_none=True)
            per_part = []
            for k, part in enumerate(parts):
                if first is not None and i == 0:
                    (out, values), first[k] = first[k], None  # its graph goes with it
                else:
                    out, values = self._forward(model, part)
                if i == 0:
                    old_logprobs[k] = out.logprobs.detach()
                    old_part_values[k] = None if values is None else values.detach()
                loss, stats = self.loss(LossInputs(
                    out.logprobs, old_logprobs[k], part.batch.behaviour_logprobs,
                    part.take(advantages), part.batch.response_mask, entropy=out.entropy,
                    ref_logprobs=ref_logprobs[k], values=values, old_values=old_part_values[k],
                    returns=part.take(returns)), self.settings, self.max_response_len)
                (loss * (part.weight * scale)).backward()
                per_part.append(({"loss": loss.item(), **stats}, part))
            self.parallel.sync_gradients(params)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
            if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
                grad_norm = grad_norm.full_tensor()
            if not self._finite([s["loss"] for s, _ in per_part], grad_norm):
                optimizer.zero_grad(set_to_none=True)  # nothing non-finite reaches a weight
                nonfinite = True
                break
            if i == 0:
                before_first_step()
            optimizer.step()
        # the gradients' memory (the weights' size) is free again until the next backward
        optimizer.zero_grad(set_to_none=True)
        stats = {**combine_stats(per_part), "grad_norm": grad_norm.item(),
                 "micro_batches": float(real)}
        if self.parallel.active:
            stats = self._whole_batch_stats(stats, share.weight)
        if self.overlong_buffer:
            stats["reward_shaped_mean"] = rewards.mean().item()
        whole_old = assemble(parts[:real], old_logprobs[:real], local.response_mask)
        return UpdateResult(self._whole_batch(whole_old, share, size), stats, nonfinite)

    def _finite(self, losses: list[float], grad_norm: torch.Tensor) -> bool:
        """Whether every rank's loss and the gradient norm are finite: one answer on every
        rank (a maximum over them), so all step or all skip, and their collectives line up."""
        bad = not (all(math.isfinite(x) for x in losses) and bool(torch.isfinite(grad_norm)))
        return not bool(self.parallel.max(torch.tensor([float(bad)])).item())

    def _reference_logprobs(self, model, part: MicroBatch) -> torch.Tensor | None:
        if self.reference_is_base:
            with torch.no_grad(), model.disable_adapter():
                return self._outputs(model, part).logprobs
        if self.reference is None:
            return None
        with torch.no_grad():
            return self._outputs(self.reference, part).logprobs

    def _whole_batch_stats(self, stats: dict[str, float], weight: float) -> dict[str, float]:
        """Maxima over the ranks; other stats weighted by the ranks' shares of the
        normaliser: exactly the whole batch's loss terms, closely means over other units
        (clip_frac, entropy under a sequence-mean loss). grad_norm is already the whole
        model's."""
        maxima = [k for k in stats if k.endswith("_max")]
        means = [k for k in stats if k != "grad_norm" and k not in maxima]
        top = (self.parallel.max(torch.tensor([stats[k] for k in maxima], dtype=torch.float64))
               if maxima else torch.zeros(0))
        mean = self.parallel.sum(torch.tensor([stats[k] * weight for k in means],
                                              dtype=torch.float64))
        return {**stats, **dict(zip(maxima, top.tolist(), strict=True)),
                **dict(zip(means, mean.tolist(), strict=True))}


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref
