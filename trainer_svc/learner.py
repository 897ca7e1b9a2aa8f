"""What every rank of the trainer holds and does: the policy, the loss's own models and the
optimizer; a policy update on a batch, the whole weights, the whole training state, a restore.
On rank 0 each operation first has the followers run it too (see trainer_svc.distributed);
in one process it is just the operation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from relayrl.config import AdafactorConfig, ConfigError, OptimizerConfig, TrainerRun
from relayrl_torch.models.loading import LoadedModel
from relayrl_torch.models.lora import adapter_state, load_adapter, with_lora
from relayrl_torch.weights.tied import tied_aliases, without
from trainer_svc.batching import TrainBatch
from trainer_svc.distributed import Parallel
from trainer_svc.objective import Objective, UpdateResult


@dataclass
class TrainingState:
    """Whole on rank 0, empty on the others; CPU tensors (in one process on the CPU, the
    live ones), so a checkpoint loads on any device."""

    model: dict[str, torch.Tensor]
    objective: dict
    optimizer: dict
    optimizer_by_name: bool  # keyed by parameter name (torchrun) or by position (one process)


class Learner:
    FOLLOWED = ("update", "weights", "training_state", "restore")

    def __init__(self, cfg: TrainerRun, lm: LoadedModel, parallel: Parallel | None = None):
        tc = cfg.trainer
        self.lm = lm
        self.parallel = parallel or Parallel()
        self.lora = tc.lora is not None
        if self.lora:
            if self.parallel.active:
                raise ConfigError("trainer.lora: an adapter trains in one trainer process; "
                                  "run the trainer without torchrun")
            # the base frozen: its parameters get no gradients and no optimizer state
            lm.model = with_lora(lm.model, tc.lora)
        if tc.activation_checkpointing:
            # non-reentrant: right with frozen inputs (LoRA) and with the shared-prefix pass
            lm.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        self.tied = tied_aliases(lm.model)  # published once, under the first name
        # before the policy is sharded: the reference is copied from it whole (under
        # torchrun both are built on the meta device, and each reads its weights from lm.path)
        self.objective = Objective(tc, lm.model, cfg.generation.max_new_tokens,
                                   cfg.generation.temperature, self.parallel, lm.path)
        self.parallel.shard(lm.model, self.objective.precision, lm.path)
        trained = [p for p in lm.model.parameters() if p.requires_grad]
        self.optimizer_kind = tc.optimizer.kind
        self.optimizer = build_optimizer(tc.optimizer, [*trained, *self.objective.parameters()],
                                         sharded=self.parallel.active)
        # the optimizer's modules by name, which key its whole state under torchrun
        heads = {"value_head": self.objective.value_head} if self.objective.value_head else {}
        self.trainable = nn.ModuleDict({"policy": lm.model, **heads})
        # every rank is built: from here on the followers wait for rank 0's operations
        self.parallel.start_heartbeat()

    def update(self, tb: TrainBatch,
               before_first_step: Callable[[], None] = lambda: None) -> UpdateResult:
        model = self.lm.model
        with self.parallel.leading("update", tb):
            model.train()
            try:
                return self.objective.update(model, self.optimizer, tb, before_first_step)
            finally:
                model.eval()

    def weights(self) -> dict[str, torch.Tensor]:
        """What a version ships: the policy's whole weights, each tied tensor once
        (relayrl_torch.weights.tied), or with trainer.lora the adapter alone; in one process the
        live tensors."""
        with self.parallel.leading("weights"):
            if self.lora:
                return adapter_state(self.lm.model)
            return without(self.parallel.full_state_dict(self.lm.model), self.tied)

    def training_state(self) -> TrainingState:
        """The model's part is what changes in training: the whole weights, or the adapter
        (the base is the model's own directory, read again on resume)."""
        with self.parallel.leading("training_state"):
            return TrainingState(
                to_cpu(adapter_state(self.lm.model) if self.lora
                       else self.parallel.full_state_dict(self.lm.model)),
                to_cpu(self.objective.state_dict()),
                to_cpu(self.parallel.full_optimizer_state(self.trainable, self.optimizer)),
                self.parallel.active)

    def restore(self, objective: dict, model: dict | None = None,
                optimizer: dict | None = None, optimizer_by_name: bool = False) -> None:
        """Rank 0 passes the whole state; the followers get only `objective` (it is small)."""
        if self.parallel.world.is_main and optimizer_by_name != self.parallel.active:
            raise ValueError("the checkpoint's optimizer state was written by a "
                             f"{'torchrun' if optimizer_by_name else 'one-process'} trainer; "
                             "resume it the same way")
        kind, written = self.optimizer_kind, checkpoint_optimizer_kind(optimizer or {})
        if self.parallel.world.is_main and written not in (None, kind):
            raise ValueError(f"the checkpoint's optimizer state is {written}'s and "
                             f"trainer.optimizer.kind is {kind!r}; resume with kind {written!r}, "
                             "or start a new run_dir")
        with self.parallel.leading("restore", objective):
            if self.lora:
                load_adapter(self.lm.model, model or {}, version=-1)
            else:
                self.parallel.load_full_state_dict(self.lm.model, model or {})
            self.objective.load_state_dict(objective)
            self.parallel.load_optimizer_state(self.trainable, self.optimizer, optimizer or {})

    def follow(self) -> None:
        """On a follower: run what rank 0 leads until it stops."""
        while True:
            op, args = self.parallel.receive()
            if op == "stop":
                return
            if op not in self.FOLLOWED:
                raise RuntimeError(f"rank 0 led an unknown operation {op!r}")
            getattr(self, op)(*args)

    def stop_followers(self) -> None:
        self.parallel.stop_followers()


def build_optimizer(oc: OptimizerConfig, params: list[nn.Parameter],
                    sharded: bool = False) -> torch.optim.Optimizer:
    """trainer.optimizer's optimizer over `params`."""
    if isinstance(oc, AdafactorConfig):
        # foreach=False: one tensor's temporaries at a time (a squared gradient the size of
        # the embedding), where foreach would hold every tensor's at once
        return torch.optim.Adafactor(params, lr=oc.lr, beta2_decay=oc.beta2_decay,
                                     weight_decay=oc.weight_decay, foreach=False)
    # fused: one vectorized, threaded kernel over every tensor, where the default loops over
    # them in Python (SmolLM2 on 2 cores: 0.09 s a step against 0.3); sharded (DTensor)
    # parameters keep the default
    return torch.optim.AdamW(params, lr=oc.lr, betas=oc.betas, weight_decay=oc.weight_decay,
                             fused=not sharded)


def checkpoint_optimizer_kind(state: dict) -> str | None:
    """Which optimizer wrote `state` (an optimizer's state dict), from its hyperparameters;
    None when it holds no groups."""
    groups = state.get("param_groups") or [{}]
    return ("adafactor" if "beta2_decay" in groups[0] else "adamw" if "betas" in groups[0]
            else None)


def to_cpu(tree):
    """`tree` (dicts, lists and tuples of tensors and other values) with every tensor on the
    CPU; a CPU tensor is returned as it is, not copied."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(to_cpu(v) for v in tree)
    return tree
