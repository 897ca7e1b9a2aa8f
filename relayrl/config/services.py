"""What each service is handed: its own section and, typed, the few values it shares with
the others. RunConfig is the file a user writes, one section per owner; `RunConfig.part(s)`
hands service `s` its part, so that a service reads no other service's section and every
value that crosses from one owner to another is named here, once.

    scheduler = SchedulerRun                 # what the scheduler holds
    cfg.part("scheduler_svc").groups.group_size  # the buffer's group size, handed to it
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import ConfigDict, Field, field_validator

from relayrl.config.base import StrictModel
from relayrl.config.bench import BenchConfig
from relayrl.config.buffer import BufferConfig
from relayrl.config.environment import EnvironmentConfig
from relayrl.config.eval import EvalConfig
from relayrl.config.model import ModelConfig, TinyModel, model_shorthand
from relayrl.config.redis import RedisConfig
from relayrl.config.relay import RelayConfig
from relayrl.config.rollout import RolloutConfig
from relayrl.config.scheduler import SchedulerConfig
from relayrl.config.security import AuthConfig
from relayrl.config.task import AdditionTaskConfig, TaskConfig, task_shorthand
from relayrl.config.trainer import LoraConfig, TrainerConfig, WandbConfig
from relayrl.rules.staleness import inflight_prompts


class RunCommon(StrictModel):
    """The run's own values, which belong to no service: its name and directory, Redis, the
    credentials, the model and the task. Every service reads these."""

    run_id: str = Field(
        "tiny", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$",
        description="Names the run's Redis keys and directory.",
    )
    run_dir: str = Field("runs/tiny", description="Metrics, checkpoints, logs and plots.")
    redis: RedisConfig = Field(default_factory=RedisConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig,
                             description="Shared token and gRPC TLS of every service.")
    model: ModelConfig = Field(default_factory=TinyModel,
                               description="The policy model, picked by `kind` (tiny, hf or "
                               "pretrained; relayrl/config/model.py).")
    task: TaskConfig = Field(default_factory=AdditionTaskConfig,
                             description="What to train on, picked by `source` "
                             "(relayrl/config/task.py).")

    @field_validator("task", mode="before")
    @classmethod
    def _task_shorthand(cls, value: Any) -> Any:
        return task_shorthand(value)

    @field_validator("model", mode="before")
    @classmethod
    def _model_shorthand(cls, value: Any) -> Any:
        return model_shorthand(value)

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir)


class Handed(StrictModel):
    """A value one owner hands another: built by RunConfig, never written by hand."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class LiveDefaults(Handed):
    """The configured values of the live settings (relayrl.contracts.control.LiveSettings),
    which an operator may change while the run goes on: trainer.max_staleness and
    rollout.temperature."""

    max_staleness: int
    temperature: float


class GroupTerms(Handed):
    """The buffer's shape of the run's data: samples per prompt and groups per batch."""

    group_size: int
    groups_per_batch: int


@dataclass(frozen=True)
class PromptWindow:
    """The longest prompt a run's rollout takes: what its engine holds (the model's context,
    or a vLLM engine's max_model_len when smaller) less the response it must leave room for,
    within rollout.max_prompt_tokens. Tasks measure their prompts against `longest` when they
    are built; a worker refuses to start on an engine that holds less."""

    context: int  # the model's context length
    engine: int  # the engine's window: min(context, rollout.engine.max_model_len if set)
    engine_source: str  # which setting gives `engine`
    max_new_tokens: int
    max_prompt_tokens: int

    @property
    def longest(self) -> int:
        return min(self.max_prompt_tokens, self.engine - self.max_new_tokens)

    def describe(self) -> str:
        room = (f"{self.engine_source} {self.engine} less rollout.max_new_tokens "
                f"{self.max_new_tokens}")
        if self.max_prompt_tokens < self.engine - self.max_new_tokens:
            return f"rollout.max_prompt_tokens {self.max_prompt_tokens}, within {room}"
        return room



class PromptTerms(Handed):
    """What bounds a prompt, as the rollout's engine holds it: RunConfig.prompt_window reads
    these with the model's context."""

    max_new_tokens: int
    max_prompt_tokens: int
    max_model_len: int  # rollout.engine.max_model_len of a vLLM engine; 0: the model's context

    def window(self, model: ModelConfig) -> PromptWindow:
        """The longest prompt the engine takes (reads the model's config.json for model.kind
        hf, and for pretrained once converted)."""
        context = model.limits().context_length
        engine, source = context, "the model's context"
        if self.max_model_len and self.max_model_len < context:
            engine, source = self.max_model_len, "rollout.engine.max_model_len"
        return PromptWindow(context, engine, source, self.max_new_tokens,
                            self.max_prompt_tokens)


class Generation(Handed):
    """The rollout's sampling, which the trainer's objective and its evaluation read back: the
    response cap (rollout.max_new_tokens), the configured temperature, and the environment
    samples play their episodes in (rollout.environment; None: one completion a sample)."""

    max_new_tokens: int
    temperature: float
    environment: EnvironmentConfig | None

    @property
    def episodes(self) -> bool:
        return self.environment is not None


class PublishTarget(Handed):
    """Where the trainer publishes each version: the root relay's address and its transfer
    settings (relay.chunk_bytes, relay.timeout_s), and relay.shm_dir when the trainer
    publishes through shared memory (trainer.publish_plane shm)."""

    address: str
    chunk_bytes: int
    timeout_s: float
    shm_dir: str | None


class ServicePart(RunCommon):
    """A service's part of the run: the run's own values, then its section and what it is
    handed. Frozen: a service's state is its own, never written into its config."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class PromptedPart(ServicePart):
    """A part whose service builds the run's task, whose prompts are measured against the
    engine's window: the scheduler (which hands them out), the trainer and the evaluator
    (which build the eval sets) and the rollout worker (which refuses an engine that holds
    less)."""

    prompts: PromptTerms

    def prompt_window(self) -> PromptWindow:
        return self.prompts.window(self.model)


class SchedulerRun(PromptedPart):
    scheduler: SchedulerConfig
    groups: GroupTerms
    live: LiveDefaults
    repack_capacity: int  # sequences a worker runs at once, for repacking; 0 with it off

    @property
    def inflight_limit(self) -> int:
        """Prompts allowed out at once: scheduler.max_inflight_prompts, or derived from the
        batch size and the configured staleness bound (inflight_prompts)."""
        return inflight_limit(self.scheduler, self.groups.groups_per_batch,
                              self.live.max_staleness)


class TrainerRun(PromptedPart):
    trainer: TrainerConfig
    eval: EvalConfig  # the evaluation's settings, which the trainer follows with eval.mode inline
    generation: Generation
    publish: PublishTarget
    live: LiveDefaults

    def metric_sinks(self) -> MetricSinks:
        return MetricSinks(tensorboard=self.trainer.tensorboard, wandb=self.trainer.wandb)


class BufferRun(ServicePart):
    buffer: BufferConfig
    live: LiveDefaults


class RelayRun(ServicePart):
    relay: RelayConfig


class RelayLink(Handed):
    """How a puller reaches the relays: the addresses it pulls from in order of preference
    (RunConfig.relay_addresses: rollout.relays, else the child relay, then the root) and the
    relay's chunk size and call timeout (relay.chunk_bytes, relay.timeout_s)."""

    addresses: list[str]
    chunk_bytes: int
    timeout_s: float


class MetricSinks(Handed):
    """Where a run's metrics go besides their file, as the trainer's section says:
    trainer.tensorboard and trainer.wandb. The evaluator writes its records to the same."""

    tensorboard: bool
    wandb: WandbConfig


class TrainerTerms(Handed):
    """The trainer's values the evaluator follows: trainer.lora (the versions it pulls are
    the adapter, wrapped in these settings), trainer.max_steps (the last version, after
    which it exits) and trainer.torch_threads (the threads `relayrl eval` decodes a
    checkpoint with, as the trainer would)."""

    lora: LoraConfig | None
    max_steps: int
    torch_threads: int


class RunsTask(Protocol):
    """What builds the run's task (relayrl_tasks.tasks.load_run_task): a RunConfig or a
    service's part that holds the prompt terms."""

    @property
    def task(self) -> TaskConfig: ...
    @property
    def model(self) -> ModelConfig: ...
    def prompt_window(self) -> PromptWindow: ...
    def model_copy(self, *, update: dict[str, Any] | None = None,
                   deep: bool = False) -> Any: ...


class EvaluatesSets(RunsTask, Protocol):
    """What builds the eval sets (relayrl_torch.evaluation.build_sets): a RunConfig (the
    trainer's inline evaluation) or an EvalRun (the evaluator)."""

    @property
    def eval(self) -> EvalConfig: ...
    @property
    def generation(self) -> Generation: ...


class WritesMetrics(Protocol):
    """What opens a run's metrics (relayrl.runtime.metrics.open_run_metrics): a RunConfig or
    an EvalRun."""

    @property
    def run_id(self) -> str: ...
    @property
    def run_dir(self) -> str: ...
    def metric_sinks(self) -> MetricSinks: ...
    def model_dump(self, *, mode: str = "python") -> dict[str, Any]: ...


class EvalRun(PromptedPart):
    """The evaluator's part (eval_svc): its section, how it reaches the relays and which
    plane it pulls through, the trainer's values it follows, the prompt terms and the
    generation its sets take from the rollout, and the trainer's metric sinks."""

    eval: EvalConfig
    relays: RelayLink
    weight_plane: Literal["grpc", "shm", "torch_dist", "nixl", "nccl", "vllm"]  # rollout's
    torch_threads: int  # rollout.torch_threads: the evaluator decodes as a worker does
    follows: TrainerTerms  # the trainer's values it follows
    generation: Generation
    sinks: MetricSinks

    def metric_sinks(self) -> MetricSinks:
        return self.sinks

    @property
    def pull_plane(self) -> str:
        """The plane the evaluator pulls versions through: the workers' (rollout.weight_plane),
        but gRPC where that is vllm, which delivers into vLLM alone."""
        return "grpc" if self.weight_plane == "vllm" else self.weight_plane


class SubmitTerms(Handed):
    """What the buffer takes from a worker: rewards within buffer.reward_range (outside: a
    reward error, scored 0), at most buffer.max_pending_samples samples in its stream, and
    the groups of agents' episodes through Buffer.Submit at buffer.endpoint."""

    address: str
    reward_range: tuple[float, float]
    max_pending_samples: int


class LeaseTerms(Handed):
    """The scheduler's side of a worker's leases: where it listens and how long a call may
    take (scheduler.endpoint, scheduler.call_timeout_s), how often a worker beats and how
    long a silent lease lives (scheduler.heartbeat_interval_s, scheduler.lease_ttl_s), how
    many versions a lease may start behind (scheduler.max_start_lag), and repacking: a worker
    holding at most repack_below of the repack_capacity sequences it runs at once has them
    repacked (RunConfig.repack_capacity; 0 with repacking off)."""

    address: str
    call_timeout_s: float
    heartbeat_interval_s: float
    lease_ttl_s: float
    max_start_lag: int
    repack_below: float
    repack_capacity: int


class RolloutRun(PromptedPart):
    """A rollout worker's part (rollout_svc): its section and the bench's synthetic lengths;
    the buffer's group shape and what it takes; the scheduler's lease terms; how it reaches
    the relays; the live defaults; the prompt terms; the trainer's adapter (trainer.lora),
    which the versions it pulls are; on the vllm weight plane, the transfer engine its
    vLLM engine starts with (RunConfig.vllm_transfer); and whether the trainer replays a
    mixture of experts' routes (trainer.routing_replay), which its engine then records."""

    rollout: RolloutConfig
    bench: BenchConfig
    groups: GroupTerms
    submit: SubmitTerms
    lease: LeaseTerms
    relays: RelayLink
    live: LiveDefaults
    lora: LoraConfig | None
    vllm_transfer: Literal["ipc", "nccl"] | None
    routing_replay: bool  # trainer.routing_replay: record each token's experts


def inflight_limit(scheduler: SchedulerConfig, groups_per_batch: int, max_staleness: int) -> int:
    """scheduler.max_inflight_prompts if set, else as many prompts as `max_staleness`
    versions of batches of `groups_per_batch` groups take (inflight_prompts)."""
    if scheduler.max_inflight_prompts:
        return scheduler.max_inflight_prompts
    return inflight_prompts(groups_per_batch, max_staleness)
