"""The trainer: its loss recipe (relayrl/config/loss.py), optimizer, checkpoints and
reporting."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from relayrl.config.base import (
    DEVICE_HELP,
    DEVICE_PATTERN,
    Endpoint,
    GrpcLimits,
    MiB,
    StrictModel,
    foreign_fields,
    grpc_limits,
    tagged_shorthand,
)
from relayrl.config.loss import RECIPES, GrpoLoss, LossConfig, shorthand

# Fields that lived flat on the trainer before each loss recipe had its own model.
MOVED_TO_LOSS = ("correction", "tis_cap", "clip_eps", "clip_eps_low", "clip_eps_high",
                 "gspo_clip_eps", "scale_rewards", "kl_coef", "kl_estimator", "entropy_coef",
                 "overlong_buffer", "overlong_penalty", "gamma", "gae_lambda", "value_coef",
                 "value_clip")
# Fields that moved into other sections: old key -> the new one.
MOVED_OUT = {"eval_every": "eval.every", "lr": "trainer.optimizer.lr",
             "weight_decay": "trainer.optimizer.weight_decay",
             "grad_clip": "trainer.optimizer.grad_clip",
             "checkpoint_every": "trainer.checkpoint.every",
             "keep_checkpoints": "trainer.checkpoint.keep"}


class OptimizerBase(StrictModel):
    kind: str
    lr: float = Field(1e-3, gt=0, le=1.0, description="Learning rate.")
    weight_decay: float = Field(0.0, ge=0, le=1.0, description="Decoupled weight decay.")
    grad_clip: float = Field(1.0, gt=0, le=1e6, description="Gradient-norm clip.")

    @classmethod
    def refused_keys(cls, data: dict[str, Any]) -> dict[str, str]:
        """A key this optimizer lacks is refused naming the optimizers that have it."""
        return foreign_fields(data, cls, OPTIMIZERS, "kind", "optimizer")


class AdamWConfig(OptimizerBase):
    """AdamW: two float32 moments per trained parameter, 8 bytes each beside its gradient."""

    kind: Literal["adamw"] = "adamw"
    betas: tuple[float, float] = Field((0.9, 0.999), description="Decay of the first and "
                                       "second moments, each in [0, 1).")

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        for beta in value:
            if not 0 <= beta < 1:
                raise ValueError(f"each beta must be in [0, 1), got {beta}")
        return value


class AdafactorConfig(OptimizerBase):
    """torch.optim.Adafactor: no first moment and a second moment factored into a row and a
    column per matrix, so its state is a few bytes per row where AdamW's is 8 per
    parameter. Its steps are relative: `lr` caps the step as a fraction of each tensor's
    root mean square, so it is about AdamW's divided by the weights' root mean square
    (SmolLM2's is about 0.19: 1e-4 where AdamW takes 2e-5). The default is torch's."""

    kind: Literal["adafactor"] = "adafactor"
    lr: float = Field(1e-2, gt=0, le=1.0, description="Relative step size cap.")
    beta2_decay: float = Field(-0.8, ge=-1.0, le=0.0, description="The second moment's "
                               "decay at step t is 1 - t**beta2_decay.")


OPTIMIZERS: dict[str, type[OptimizerBase]] = {
    c.model_fields["kind"].default: c for c in (AdamWConfig, AdafactorConfig)}
OptimizerConfig = Annotated[AdamWConfig | AdafactorConfig, Field(discriminator="kind")]


class CheckpointConfig(StrictModel):
    """The trainer's checkpoints, each a loadable Hugging Face directory."""

    every: int = Field(10, ge=1, le=1_000_000, description="Steps per checkpoint.")
    keep: int = Field(2, ge=1, le=1000, description="Checkpoints kept on disk.")


class WandbConfig(StrictModel):
    """Weights & Biases: every metric of metrics.jsonl (and eval.jsonl) also goes to a run."""

    mode: Literal["disabled", "online", "offline"] = Field(
        "disabled", description="offline writes <run_dir>/wandb for a later `wandb sync`; "
        "online needs the network and a login (needs the wandb package).")
    project: str = Field("relayrl", min_length=1, max_length=128, description="W&B project.")
    entity: str | None = Field(None, min_length=1, max_length=128,
                               description="W&B entity (team or user); unset: the default.")
    name: str | None = Field(None, min_length=1, max_length=128,
                             description="W&B run name; unset: run_id.")


class LoraConfig(StrictModel):
    """A LoRA adapter (peft) trained in place of the whole model: the base weights stay
    frozen, and each version the relay ships is the adapter alone."""

    rank: int = Field(16, ge=1, le=4096, description="The adapter's rank r.")
    alpha: float = Field(32.0, gt=0, le=1e6,
                         description="Scale numerator: the update is (alpha / rank) B A.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input.")
    target_modules: Literal["all-linear"] | list[str] = Field(
        "all-linear", description="The modules that get an adapter: every linear layer but "
        "the output head (all-linear), or their names (e.g. [q_proj, v_proj]).")


class TrainerConfig(StrictModel):
    endpoint: Endpoint = Field(default_factory=lambda: Endpoint(port=50554))
    loss: LossConfig = Field(
        default_factory=GrpoLoss, description="Policy loss recipe, picked by `name` from "
        "the registry in trainer_svc/losses (README: Algorithms) with its own fields "
        "(relayrl/config/loss.py).",
    )
    optimizer: OptimizerConfig = Field(
        default_factory=AdamWConfig, description="Optimizer, picked by `kind` (adamw or "
        "adafactor) with its own fields; `optimizer: adafactor` is short for "
        "{kind: adafactor}, and a mapping without a kind is AdamW's.")
    lora: LoraConfig | None = Field(
        None, description="Train a LoRA adapter instead of the whole model (needs peft, the "
        "relayrl[lora] extra); unset: full fine-tuning.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig,
                                         description="How often checkpoints are written and "
                                         "how many are kept.")
    max_steps: int = Field(100, ge=1, le=10_000_000, description="Optimizer steps to run.")
    max_staleness: int = Field(
        4, ge=0, le=1_000_000,
        description="Drop samples whose oldest token version lags the trainer by more.",
    )
    updates_per_batch: int = Field(
        1, ge=1, le=64, description="Optimizer steps on each batch (PPO epochs); above 1 the "
        "policy moves away from pi_old within a batch and the ratio clip takes effect.",
    )
    micro_batch_tokens: int = Field(
        8192, ge=0, le=10_000_000,
        description="Most padded tokens (rows x longest row; with shared_prefix, rows x longest "
        "response, each distinct prompt running once besides) in one forward and backward "
        "pass. A batch's rows are sorted by length and split where that saves padding, so a "
        "long-tailed batch no longer pads every row to its longest; 0: one pass per batch.",
    )
    shared_prefix: bool = Field(
        True, description="Run each distinct prompt of a pass once and its samples' responses "
        "against its cached keys and values (trainer_svc.shared_prefix): the same "
        "log-probabilities and gradients for fewer tokens when a group's samples share a "
        "prompt; false runs every row whole.",
    )
    packing: bool = Field(
        False, description="Pack the sequences of a pass that runs rows whole (shared_prefix "
        "false, or activation_checkpointing on) end to end into rows of at most "
        "micro_batch_tokens tokens, each with its own position ids and attention confined to "
        "it (trainer_svc.packing; one row a pass under flash attention): the same "
        "log-probabilities and gradients without padding. Off by default: on the CPU the "
        "length-sorted micro-batches leave about 3% padding on the tool example's episodes, "
        "and packed steps measured 0.94x their speed (bench/packing.py). Under shared_prefix "
        "the shared-prefix pass runs instead.",
    )
    activation_checkpointing: bool = Field(
        False, description="Recompute each decoder layer's activations in the backward pass "
        "instead of keeping them (transformers' gradient checkpointing, non-reentrant): "
        "the update holds about one layer's activations rather than all of them, for about "
        "a third more compute. The same gradients. Rows then run whole (shared_prefix is off: "
        "checkpointed layers keep no keys and values for the responses to reuse).",
    )
    routing_replay: bool = Field(
        True, description="For a mixture-of-experts model: the rollout engine records the "
        "experts it routed every token to, and the trainer's forward takes those experts in "
        "place of its router's top-k, weighting them by its router's softmax "
        "(relayrl_torch.models.routing), so a near-tie the engine's rounding broke the other "
        "way moves no log-probability. A dense model has no routes: nothing changes.",
    )
    mmap_threshold_mib: int | None = Field(
        None, ge=1, le=32,
        description="Allocations of at least this many MiB get their own mapping, returned "
        "to the system as soon as they are freed (glibc's M_MMAP_THRESHOLD, at most 32); "
        "unset: glibc's own, which keeps a pass's freed temporaries resident until the "
        "trim after the update (docs/guides/models.md, SmolLM2 in under 5 GiB).",
    )
    max_nonfinite_steps: int = Field(
        3, ge=1, le=1000,
        description="Steps in a row whose loss or gradient norm is not finite before the "
        "trainer stops the run; each such step is skipped (no update, no publish) and its "
        "batch recorded in the quarantine.",
    )
    engine_check_versions: int = Field(
        2, ge=0, le=64,
        description="Past versions' parameters kept to re-score tokens under the version that "
        "sampled them (the engine-vs-trainer check); each costs one copy of the parameters.",
    )
    engine_check_seqs: int = Field(
        4, ge=0, le=4096,
        description="Sequences of older versions re-scored per step for that check (one "
        "no-grad forward over them); 0 turns it off and keeps no past versions.",
    )
    plot_every: int = Field(
        10, ge=1, le=1_000_000, description="Steps per redraw of reward.png and throughput.png."
    )
    tensorboard: bool = Field(
        False, description="Also write every step's metrics as TensorBoard scalars under "
        "<run_dir>/tensorboard (needs the tensorboard package).",
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig,
                               description="Also log every metric to Weights & Biases.")
    metrics_port: int = Field(
        0, ge=0, le=65535,
        description="HTTP port of Prometheus /metrics and /healthz, on endpoint.host (rank 0 "
        "under torchrun); 0 serves none.",
    )
    grpc: GrpcLimits = Field(
        default_factory=grpc_limits(64),
        description="The gRPC server's limits. It serves Status alone, so max_receive_bytes "
        "None is 1 MiB; 64 calls at once.",
    )

    @property
    def grpc_receive_bytes(self) -> int:
        return self.grpc.receive_bytes(MiB)

    torch_threads: int = Field(1, ge=1, le=256, description="Intra-op threads.")
    publish_plane: Literal["grpc", "shm"] = Field(
        "grpc", description="How versions reach the relay. shm, for a trainer on the relay's "
        "host: each version is written into a file in relay.shm_dir that the relay takes "
        "over (relayrl_torch.weights.shm_handoff), instead of streamed through gRPC; needs "
        "'shm' in relay.data_planes. A relay that cannot take the file gets the bytes over gRPC.",
    )
    device: str = Field(
        "auto", pattern=DEVICE_PATTERN,
        description=f"Where the trainer holds the model and runs its passes: {DEVICE_HELP}. "
        "Under torchrun with more than one process each rank takes cuda:LOCAL_RANK (auto or "
        "cuda) or the CPU (cpu). Published weights and checkpoints are CPU tensors on any.",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="Compute dtype of the trainer's forward and backward passes. "
        "bf16: matrix products under torch.autocast in bfloat16, and under torchrun FSDP2 "
        "gathers parameters in bfloat16 and reduces gradients in float32; parameters, "
        "gradients and AdamW state stay float32, and log-softmax and log-probabilities are "
        "computed in float32. fp32: float32 throughout. auto: bf16 on a GPU that supports "
        "it, else fp32.",
    )
    fsdp: bool = Field(
        True, description="Under torchrun with more than one process: shard parameters, "
        "gradients and optimizer state with FSDP2; false keeps the whole model on every rank "
        "and all-reduces gradients. One process ignores it.",
    )
    dist_timeout_s: float = Field(
        1800.0, ge=1, le=86_400,
        description="Under torchrun: seconds a collective may wait for every rank before the "
        "process group aborts it (init_process_group's timeout; torch's NCCL default is 600). "
        "While rank 0 waits between operations (for a batch, for Redis or a relay through an "
        "outage, while a checkpoint is written) it leads an idle operation every tenth of "
        "it, so idleness never reaches it; what it bounds is a rank that hangs, and the "
        "longest single wait of a collective (reading the weights at start-up).",
    )
    seed: int = Field(0, ge=0, description="Trainer RNG seed.")
    progress: bool = Field(True, description="Show a progress bar on stderr.")

    @classmethod
    def refused_keys(cls, data: dict[str, Any]) -> dict[str, str]:
        """An old flat loss field (trainer.clip_eps), or one moved to another section
        (trainer.eval_every), is refused saying where it lives now."""
        refused = {}
        for key, new in MOVED_OUT.items():
            if key in data:
                *sections, field = new.split(".")
                example = f"{field}: {data[key]!r}"
                for section in reversed(sections):
                    example = f"{section}: {{{example}}}"
                refused[key] = f"trainer.{key} is now {new}, as in `{example}`"
        for key in MOVED_TO_LOSS:
            if key not in data:
                continue
            field = "clip_eps" if key == "gspo_clip_eps" else key
            owners = ["gspo"] if key == "gspo_clip_eps" else [
                n for n, c in RECIPES.items() if field in c.model_fields]
            loss = data.get("loss")
            current = loss.get("name") if isinstance(loss, dict) else loss
            name = current if current in owners else owners[0]
            refused[key] = (
                f"trainer.{key} moved into the loss recipe: set trainer.loss.{field}, as in "
                f"`trainer: {{loss: {{name: {name}, {field}: {data[key]!r}}}}}` (a field of "
                f"{', '.join(owners)})")
        return refused

    @field_validator("loss", mode="before")
    @classmethod
    def _loss_shorthand(cls, value: Any) -> Any:
        return shorthand(value)

    @field_validator("optimizer", mode="before")
    @classmethod
    def _optimizer_shorthand(cls, value: Any) -> Any:
        """`adafactor` -> {kind: adafactor}; a mapping without a kind is AdamW's."""
        return tagged_shorthand(value, "kind", "adamw")
