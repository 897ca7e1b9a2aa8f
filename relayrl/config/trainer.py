"""The trainer: loss, off-policy correction, optimizer, checkpoints and reporting."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from relayrl.config.base import Endpoint, StrictModel


class TrainerConfig(StrictModel):
    endpoint: Endpoint = Field(default_factory=lambda: Endpoint(port=50554))
    loss: Literal["grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "gspo", "ppo"] = Field(
        "grpo", description="Policy loss from the registry in trainer_svc/losses (README: "
        "Algorithms).",
    )
    correction: Literal["none", "tis_token", "tis_seq", "aipo", "decoupled"] = Field(
        "tis_token", description="Off-policy correction against the behaviour policy that "
        "sampled the tokens (trainer_svc/losses/corrections.py).",
    )
    lr: float = Field(1e-3, gt=0, le=1.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, le=1.0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, le=1e6, description="Gradient-norm clip.")
    max_steps: int = Field(100, ge=1, le=10_000_000, description="Optimizer steps to run.")
    max_staleness: int = Field(
        4, ge=0, le=1_000_000,
        description="Drop samples whose oldest token version lags the trainer by more.",
    )
    clip_eps: float = Field(
        0.2, gt=0, lt=1, description="Ratio clip [1 - eps, 1 + eps] of every loss but dapo and "
        "gspo.",
    )
    clip_eps_low: float = Field(0.2, gt=0, lt=1, description="dapo: ratio clip below, 1 - eps.")
    clip_eps_high: float = Field(
        0.28, gt=0, le=10, description="dapo: ratio clip above, 1 + eps (clip-higher)."
    )
    gspo_clip_eps: float = Field(
        4e-4, gt=0, lt=1, description="gspo: clip of the sequence-level ratio, which sits "
        "much closer to 1 than token ratios.",
    )
    tis_cap: float = Field(
        2.0, ge=1.0, le=1e6, description="Importance-weight cap: pi_old/mu above it is capped "
        "(tis_token, tis_seq) or dropped (decoupled); aipo truncates pi/mu at it.",
    )
    updates_per_batch: int = Field(
        1, ge=1, le=64, description="Optimizer steps on each batch (PPO epochs); above 1 the "
        "policy moves away from pi_old within a batch and the ratio clip takes effect.",
    )
    micro_batch_tokens: int = Field(
        8192, ge=0, le=10_000_000,
        description="Most padded tokens (rows x longest row) in one forward and backward pass. "
        "A batch's rows are sorted by length and split where that saves padding, so a "
        "long-tailed batch no longer pads every row to its longest; 0: one pass per batch.",
    )
    scale_rewards: bool = Field(
        True, description="Divide group advantages by the group std (grpo, dapo, gspo).",
    )
    kl_coef: float = Field(
        0.0, ge=0, le=100, description="Weight of the KL penalty to the frozen initial "
        "policy; 0 keeps no reference copy and reports no train/kl_ref.",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="Per-token KL estimator (Schulman): k1 = log pi/ref, k2 = half its "
        "square, k3 = ref/pi - 1 - log ref/pi.",
    )
    entropy_coef: float = Field(
        0.0, ge=0, le=10, description="Weight of the entropy bonus; the entropy is reported "
        "as train/entropy either way.",
    )
    overlong_buffer: int = Field(
        0, ge=0, le=1_048_576, description="Overlong reward shaping (DAPO): the last this many "
        "tokens before rollout.max_new_tokens ramp a penalty up to overlong_penalty; 0 is off.",
    )
    overlong_penalty: float = Field(
        1.0, ge=0, le=1000, description="Reward subtracted from a response of full length "
        "when overlong_buffer is set.",
    )
    gamma: float = Field(1.0, ge=0, le=1, description="ppo: discount per token in GAE.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="ppo: GAE lambda.")
    value_coef: float = Field(0.5, ge=0, le=100, description="ppo: weight of the value loss.")
    value_clip: float = Field(
        0.2, gt=0, le=1e6, description="ppo: a value moves at most this far from its value "
        "before the batch's first update in the clipped value loss.",
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
    checkpoint_every: int = Field(10, ge=1, le=1_000_000, description="Steps per checkpoint.")
    keep_checkpoints: int = Field(2, ge=1, le=1000, description="Checkpoints kept on disk.")
    eval_every: int = Field(10, ge=0, le=1_000_000, description="Steps per eval; 0 disables.")
    plot_every: int = Field(
        10, ge=1, le=1_000_000, description="Steps per redraw of reward.png and throughput.png."
    )
    tensorboard: bool = Field(
        False, description="Also write every step's metrics as TensorBoard scalars under "
        "<run_dir>/tensorboard (needs the tensorboard package).",
    )
    metrics_port: int = Field(
        0, ge=0, le=65535,
        description="HTTP port of Prometheus /metrics and /healthz, on endpoint.host (rank 0 "
        "under torchrun); 0 serves none.",
    )
    torch_threads: int = Field(1, ge=1, le=256, description="Intra-op threads.")
    fsdp: bool = Field(
        True, description="Under torchrun with more than one process: shard parameters, "
        "gradients and optimizer state with FSDP2; false keeps the whole model on every rank "
        "and all-reduces gradients. One process ignores it.",
    )
    seed: int = Field(0, ge=0, description="Trainer RNG seed.")
    progress: bool = Field(True, description="Show a progress bar on stderr.")
