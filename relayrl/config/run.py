"""The run config: every service's config plus the checks that they agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from relayrl.config.base import (
    ConfigError,
    apply_overrides,
    is_loopback,
    load_model,
    read_yaml,
)
from relayrl.config.bench import BenchConfig
from relayrl.config.buffer import BufferConfig
from relayrl.config.environment import EnvironmentConfig
from relayrl.config.eval import EvalConfig
from relayrl.config.model import TinyModel
from relayrl.config.relay import RelayConfig
from relayrl.config.resources import Placement, ResourcesConfig
from relayrl.config.restarts import RestartConfig
from relayrl.config.rollout import RolloutConfig, VllmEngineConfig
from relayrl.config.scheduler import SchedulerConfig
from relayrl.config.services import (
    BufferRun,
    EvalRun,
    Generation,
    GroupTerms,
    LeaseTerms,
    LiveDefaults,
    MetricSinks,
    PromptTerms,
    PromptWindow,
    PublishTarget,
    RelayLink,
    RelayRun,
    RolloutRun,
    RunCommon,
    SchedulerRun,
    ServicePart,
    SubmitTerms,
    TrainerRun,
    TrainerTerms,
    inflight_limit,
)
from relayrl.config.trainer import TrainerConfig
from relayrl.runtime.deadlines import REDIS_BLOCK_MARGIN_S

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
VLLM_MAX_LORA_RANK = 512  # the largest LoRA rank vLLM serves
# vLLM 0.32's CPU attention kernels (CPUAttentionBackend.get_supported_head_sizes)
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


class RunConfig(RunCommon):
    relay: RelayConfig = Field(default_factory=RelayConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig,
                             description="Held-out evaluation (relayrl/config/eval.py).")
    restarts: RestartConfig = Field(default_factory=RestartConfig,
                                    description="How `relayrl up` restarts a service that dies.")
    bench: BenchConfig = Field(default_factory=BenchConfig,
                               description="Knobs only benchmarks and the simulator set "
                               "(relayrl/config/bench.py).")
    resources: ResourcesConfig | None = Field(
        None, description="Nodes, GPUs and where each process goes (relayrl/config/"
        "resources.py); None: every process sees every GPU of the machine it runs on.")

    # Cross-checks between sections: one validator per rule, run in this order.

    @model_validator(mode="after")
    def _task_rewards_inside_the_buffers(self) -> RunConfig:
        """task.reward_range lies inside buffer.reward_range: what Submit admits, a sample
        may carry."""
        (low, high), (least, most) = self.task.reward_range, self.buffer.reward_range
        if not least <= low < high <= most:
            raise ValueError(f"task.reward_range [{low:g}, {high:g}] must lie inside "
                             f"buffer.reward_range [{least:g}, {most:g}]")
        return self

    @model_validator(mode="after")
    def _weight_plane_is_served(self) -> RunConfig:
        """rollout.weight_plane is one of relay.data_planes."""
        if self.rollout.weight_plane not in self.relay.data_planes:
            raise ValueError(f"rollout.weight_plane {self.rollout.weight_plane!r} is not in "
                             f"relay.data_planes {self.relay.data_planes}")
        return self

    @model_validator(mode="after")
    def _tiny_model_knows_only_addition(self) -> RunConfig:
        """The tiny model (model.kind tiny) runs raw addition prompts only: task.source
        'addition' with prompt_format 'raw', in training and in every eval set."""
        if not isinstance(self.model, TinyModel):
            return self
        tasks = [("task", self.task)] + [(f"eval.sets {s.name!r}: task", s.task)
                                         for s in self.eval.sets if s.task is not None]
        for where, task in tasks:
            if task.source != "addition":
                what = f"{where}.source {task.source!r}"
            elif task.prompt_format == "chat":
                what = f"{where}.prompt_format 'chat'"
            else:
                continue
            raise ValueError(f"{what} needs model.kind hf or pretrained: the tiny model's "
                             "tokenizer knows only digits, '+' and '='")
        return self

    @model_validator(mode="after")
    def _lora_rank_fits_vllm(self) -> RunConfig:
        """vLLM serves LoRA adapters of rank 512 at most."""
        lora = self.trainer.lora
        if lora is not None and isinstance(self.rollout.engine, VllmEngineConfig) \
                and lora.rank > VLLM_MAX_LORA_RANK:
            raise ValueError(f"trainer.lora.rank: {lora.rank} is above {VLLM_MAX_LORA_RANK}, "
                             "the largest rank the vllm engine serves")
        return self

    @model_validator(mode="after")
    def _vllm_supports_the_tiny_head_size(self) -> RunConfig:
        """rollout.engine.kind vllm with the tiny model needs a head size (model.hidden_size /
        model.num_heads) among vLLM's CPU attention's VLLM_CPU_HEAD_SIZES."""
        if (isinstance(self.rollout.engine, VllmEngineConfig)
                and isinstance(self.model, TinyModel)
                and self.model.head_size not in VLLM_CPU_HEAD_SIZES):
            raise ValueError(
                f"rollout.engine.kind vllm cannot run the tiny model's head size "
                f"{self.model.head_size} (model.hidden_size / model.num_heads); vLLM's CPU "
                f"attention supports {list(VLLM_CPU_HEAD_SIZES)}")
        return self

    @model_validator(mode="after")
    def _engine_window_holds_a_response(self) -> RunConfig:
        """rollout.engine.max_model_len, where set, exceeds rollout.max_new_tokens: the window
        holds a prompt and a whole response."""
        engine = self.rollout.engine
        if isinstance(engine, VllmEngineConfig) and engine.max_model_len and \
                engine.max_model_len <= self.rollout.max_new_tokens:
            raise ValueError(
                f"rollout.engine.max_model_len ({engine.max_model_len}) must exceed "
                f"rollout.max_new_tokens ({self.rollout.max_new_tokens}): the window holds "
                "the prompt and the whole response")
        return self

    @model_validator(mode="after")
    def _repack_needs_segments(self) -> RunConfig:
        """scheduler.repack needs rollout.segment_tokens > 0."""
        if self.scheduler.repack and not self.rollout.segment_tokens:
            raise ValueError("scheduler.repack needs rollout.segment_tokens > 0: workers hand "
                             "recalled sequences back at segment boundaries")
        return self

    @model_validator(mode="after")
    def _verifiers_tasks_play_in_their_adapter(self) -> RunConfig:
        """task.source verifiers plays its episodes in the `verifiers` environment adapter:
        rollout.environment is filled in from the task (its limits stay the user's)."""
        if self.task.source != "verifiers":
            return self
        env = self.rollout.environment
        if env is not None and env.cls != "verifiers":
            raise ValueError(f"rollout.environment.cls {env.cls!r}: task.source verifiers "
                             "plays its episodes in the 'verifiers' adapter; leave "
                             "rollout.environment.cls unset or 'verifiers'")
        env = env or EnvironmentConfig(cls="verifiers")
        options = {"env_id": self.task.env_id, "env_args": self.task.env_args,
                   "max_turns": env.max_turns}
        if env.options and env.options != options:
            raise ValueError("rollout.environment.options: set by task.source verifiers (from "
                             "task.env_id and task.env_args); leave them unset")
        if env.options != options or self.rollout.environment is None:
            self.rollout.environment = env.model_copy(update={"options": options})
        return self

    @model_validator(mode="after")
    def _environments_run_whole_episodes(self) -> RunConfig:
        """rollout.environment needs rollout.segment_tokens 0: an episode's environment lives
        in one worker's memory, so it is neither cut into segments nor moved."""
        if self.rollout.environment is not None and self.rollout.segment_tokens:
            raise ValueError("rollout.environment needs rollout.segment_tokens 0: episodes run "
                             "whole on one worker (no partial rollouts, no repacking)")
        return self

    @model_validator(mode="after")
    def _pending_samples_hold_a_batch(self) -> RunConfig:
        """buffer.max_pending_samples is at least groups_per_batch x group_size."""
        batch_samples = self.buffer.groups_per_batch * self.buffer.group_size
        if self.buffer.max_pending_samples < batch_samples:
            raise ValueError(
                f"buffer.max_pending_samples ({self.buffer.max_pending_samples}) must hold at "
                f"least one batch, groups_per_batch x group_size ({batch_samples}): with less, "
                "no batch could ever be assembled and producers would wait forever")
        return self

    @model_validator(mode="after")
    def _redis_timeout_outlasts_a_blocking_read(self) -> RunConfig:
        """redis.socket_timeout_s exceeds buffer.read_block_ms by more than
        REDIS_BLOCK_MARGIN_S."""
        block_s = self.buffer.read_block_ms / 1000 + REDIS_BLOCK_MARGIN_S
        if self.redis.socket_timeout_s <= block_s:
            raise ValueError(
                f"redis.socket_timeout_s ({self.redis.socket_timeout_s:g}) must exceed "
                f"buffer.read_block_ms ({self.buffer.read_block_ms}) by more than "
                f"{REDIS_BLOCK_MARGIN_S:g} s: a blocking read would otherwise time out idle")
        return self

    @model_validator(mode="after")
    def _relay_rendezvous_is_dialable(self) -> RunConfig:
        """relay.data_planes torch_dist and nccl need relay.endpoint.host dialable: workers
        meet the relay for each pull at that host."""
        planes = sorted({"torch_dist", "nccl"} & set(self.relay.data_planes))
        if planes and not self.relay.endpoint.dialable:
            raise ValueError(
                f"relay.endpoint.host {self.relay.endpoint.host!r} is no address a worker can "
                f"dial, and relay.data_planes {planes} hand it to workers to meet the relay "
                "at: set host to the address workers reach this relay at, and relay.endpoint"
                ".bind to the interface it listens on (0.0.0.0 for every one)")
        return self

    @model_validator(mode="after")
    def _publish_plane_is_served(self) -> RunConfig:
        """trainer.publish_plane shm needs the relay's shm plane (and so its shm_dir)."""
        if self.trainer.publish_plane == "shm" and "shm" not in self.relay.data_planes:
            raise ValueError(f"trainer.publish_plane 'shm' needs 'shm' in relay.data_planes "
                             f"(now {self.relay.data_planes}) and relay.shm_dir")
        return self

    @model_validator(mode="after")
    def _shm_plane_has_a_directory(self) -> RunConfig:
        """relay.data_planes with 'shm' needs relay.shm_dir."""
        if "shm" in self.relay.data_planes and not self.relay.shm_dir:
            raise ValueError("relay.data_planes has 'shm' but relay.shm_dir is unset")
        return self

    @model_validator(mode="after")
    def _overlong_buffer_fits_the_length_cap(self) -> RunConfig:
        """trainer.loss.overlong_buffer is at most rollout.max_new_tokens: the penalty ramps
        over the last that many tokens before the cap."""
        if self.trainer.loss.overlong_buffer > self.rollout.max_new_tokens:
            raise ValueError(
                f"trainer.loss.overlong_buffer ({self.trainer.loss.overlong_buffer}) must be "
                f"at most rollout.max_new_tokens ({self.rollout.max_new_tokens})")
        return self

    @model_validator(mode="after")
    def _placed_workers_are_the_workers(self) -> RunConfig:
        """resources.rollout places rollout.num_workers workers, each of
        rollout.engine.tensor_parallel_size GPUs; resources.relay_children at most
        relay.children child relays."""
        res = self.resources
        if res is None:
            return self
        if res.rollout:
            placed = len(res.workers(self.gpus_per_worker))
            if placed != self.rollout.num_workers:
                raise ValueError(
                    f"resources.rollout places {placed} worker(s) of {self.gpus_per_worker} "
                    f"GPU(s), and rollout.num_workers is {self.rollout.num_workers}: make "
                    "them agree")
        if len(res.relay_children) > self.relay.children:
            raise ValueError(f"resources.relay_children places {len(res.relay_children)} "
                             f"child relays, and relay.children is {self.relay.children}")
        return self

    @model_validator(mode="after")
    def _vllm_plane_carries_whole_models_to_vllm(self) -> RunConfig:
        """rollout.weight_plane vllm needs rollout.engine.kind vllm and whole-model versions:
        vLLM takes an adapter (trainer.lora) as files, which its weight-transfer engines do
        not move."""
        if self.rollout.weight_plane != "vllm":
            return self
        if not isinstance(self.rollout.engine, VllmEngineConfig):
            raise ValueError("rollout.weight_plane vllm moves versions into vLLM's own engine: "
                             "it needs rollout.engine.kind vllm (the torch engine takes "
                             "nccl)")
        if self.trainer.lora is not None:
            raise ValueError("rollout.weight_plane vllm: adapter versions (trainer.lora) reach "
                             "vLLM as files (its add_lora), which its weight-transfer engines "
                             "do not move; use grpc or shm")
        return self

    @model_validator(mode="after")
    def _nccl_pairs_are_on_two_gpus(self) -> RunConfig:
        """With rollout.weight_plane nccl or vllm and placed workers, each relay a worker
        pulls from holds one GPU, which is none of the worker's (NCCL refuses two ranks on
        one GPU), but for a one-GPU worker on the vllm plane, which reads it over CUDA IPC."""
        res, plane = self.resources, self.rollout.weight_plane
        if res is None or plane not in ("nccl", "vllm") or not res.rollout:
            return self
        for i, worker in enumerate(res.workers(self.gpus_per_worker)):
            where, relay = self.serving_relay(i)
            if len(relay.gpus) != 1:
                raise ValueError(f"rollout.weight_plane {plane}: resources.{where} holds "
                                 f"{len(relay.gpus)} GPUs, and it sends rollout worker {i} "
                                 "each version from a GPU of its own: give it one")
            shared = relay.node == worker.node and relay.gpus[0] in worker.gpus
            if shared and not (plane == "vllm" and len(worker.gpus) == 1):
                raise ValueError(
                    f"rollout.weight_plane {plane}: resources.{where} and rollout worker {i} "
                    f"are both on GPU {relay.gpus[0]} of node {relay.node}, and NCCL refuses "
                    "two ranks on one GPU: give the relay a GPU of its own")
        return self

    @model_validator(mode="after")
    def _nodes_can_reach_each_other(self) -> RunConfig:
        """With several nodes, the services peers dial from other nodes are dialled at
        addresses those nodes can reach, and Redis is a server all of them reach
        (redis.url), not one embedded on a node."""
        res = self.resources
        if res is None or len(res.nodes) < 2:
            return self
        if not self.redis.url:
            raise ValueError(f"resources.nodes: {len(res.nodes)} nodes share one Redis, which "
                             "an embedded one is not: set redis.url")
        for name in ("relay", "scheduler", "buffer", "trainer"):
            host, node = getattr(self, name).endpoint.host, getattr(res, name).node
            if host in LOOPBACK_HOSTS or not getattr(self, name).endpoint.dialable:
                raise ValueError(
                    f"{name}.endpoint.host {host!r} cannot be dialled from the run's other "
                    f"nodes: set it to node {node}'s address, {res.nodes[node].address!r} "
                    f"(resources.{name}.node)")
        return self

    @model_validator(mode="after")
    def _ports_are_distinct(self) -> RunConfig:
        """No two servers of the run (gRPC, REST, metrics, every rollout worker's) share a
        port."""
        seen: dict[int, str] = {}
        for name, port in self._ports().items():
            if port in seen:
                raise ValueError(f"{name} and {seen[port]} both use port {port}")
            seen[port] = name
        return self

    @model_validator(mode="after")
    def _plaintext_stays_on_loopback(self) -> RunConfig:
        """Without auth.tls, every address a service binds or is dialled at is loopback, and
        a Redis beyond loopback is dialled over TLS (rediss://), unless
        auth.plaintext_beyond_loopback: tokens, prompts and weights cross the network in
        plaintext otherwise."""
        if self.auth.plaintext_beyond_loopback:
            return self
        redis_host = self.redis.tcp_host
        if redis_host and not is_loopback(redis_host) and not self.redis.tls:
            raise ValueError(
                f"redis.url reaches {redis_host!r}, beyond loopback, in plaintext: every "
                "sample and the Redis password would cross the network unencrypted; use "
                "rediss:// (verified against auth.tls.ca), or auth.plaintext_beyond_loopback: "
                "true on a network only the run reaches")
        if self.auth.tls.enabled:
            return self
        for field, host in self.network_hosts().items():
            if field == "redis.url" and self.redis.tls:
                continue  # TLS of its own, verified against the system's roots
            if not is_loopback(host):
                raise ValueError(
                    f"{field} {host!r} is beyond loopback and auth.tls is unset: the run's "
                    "tokens and weights would cross the network in plaintext; set auth.tls "
                    "(cert, key, ca), or auth.plaintext_beyond_loopback: true on a network "
                    "only the run reaches")
        return self

    @property
    def beyond_loopback(self) -> bool:
        """Whether any service binds or is dialled beyond loopback (network_hosts)."""
        return not all(is_loopback(host) for host in self.network_hosts().values())

    def network_hosts(self) -> dict[str, str]:
        """Field -> host of every address the run's services bind or dial (gRPC endpoints,
        the REST and OpenAI-compatible HTTP servers, metrics exporters, relays followed,
        nodes)."""
        hosts: dict[str, str] = {}
        for section in ("relay", "scheduler", "buffer", "trainer"):
            endpoint = getattr(self, section).endpoint
            hosts[f"{section}.endpoint.host"] = endpoint.host
            if endpoint.bind is not None:
                hosts[f"{section}.endpoint.bind"] = endpoint.bind
        if self.scheduler.rest_port:
            hosts["scheduler.rest_host"] = self.scheduler.rest_host
        hosts["rollout.host"] = self.rollout.host
        if self.rollout.bind is not None:
            hosts["rollout.bind"] = self.rollout.bind
        if self.rollout.http_base_port:
            hosts["rollout.http_host"] = self.rollout.http_host
        for field, addresses in (("relay.upstream", self.relay.upstream),
                                 ("rollout.relays", self.rollout.relays)):
            for i, address in enumerate(addresses):
                hosts[f"{field}[{i}]"] = address.rpartition(":")[0]
        for i, node in enumerate(self.resources.nodes if self.resources else ()):
            hosts[f"resources.nodes[{i}].address"] = node.address
        if self.redis.tcp_host:
            hosts["redis.url"] = self.redis.tcp_host
        return hosts

    def _ports(self) -> dict[str, int]:
        ports = {
            "relay.endpoint.port": self.relay.endpoint.port,
            "scheduler.endpoint.port": self.scheduler.endpoint.port,
            "buffer.endpoint.port": self.buffer.endpoint.port,
            "trainer.endpoint.port": self.trainer.endpoint.port,
        }
        if self.scheduler.rest_port:
            ports["scheduler.rest_port"] = self.scheduler.rest_port
        if self.resources is not None and len(self.resources.trainer.gpus) > 1:
            ports["resources.torchrun_port"] = self.resources.torchrun_port
        for section in ("relay", "scheduler", "buffer", "trainer"):
            if port := getattr(self, section).metrics_port:
                ports[f"{section}.metrics_port"] = port
        for k in range(self.relay.children):
            ports[f"child relay {k} (relay.children_base_port+{k})"] = (
                self.relay.children_base_port + k)
        for i in range(self.rollout.num_workers):
            ports[f"rollout worker {i} (rollout.base_port+{i})"] = self.rollout.base_port + i
            if self.rollout.http_base_port:
                ports[f"rollout worker {i} HTTP (rollout.http_base_port+{i})"] = (
                    self.rollout.http_base_port + i)
            if self.rollout.metrics_base_port:
                ports[f"rollout worker {i} metrics (rollout.metrics_base_port+{i})"] = (
                    self.rollout.metrics_base_port + i)
            if self.rollout.kv_transfer_base_port:
                ports[f"rollout worker {i} KV side channel "
                      f"(rollout.engine.kv_transfer_base_port+{i})"] = (
                    self.rollout.kv_transfer_base_port + i)
        return ports

    @property
    def gpus_per_worker(self) -> int:
        """GPUs one rollout worker holds: vLLM's tensor-parallel size, or 1."""
        e = self.rollout.engine
        return e.tensor_parallel_size if isinstance(e, VllmEngineConfig) else 1

    def vllm_transfer(self, worker: int) -> str:
        """The weight-transfer engine of vLLM rollout worker `worker` on the vllm plane: ipc
        when resources put it, on one GPU, on the GPU of the relay it pulls from; nccl
        otherwise."""
        res = self.resources
        if res is None or not res.rollout:
            return "nccl"
        placed = res.workers(self.gpus_per_worker)[worker]
        _, relay = self.serving_relay(worker)
        same = relay.node == placed.node and relay.gpus == placed.gpus and len(placed.gpus) == 1
        return "ipc" if same else "nccl"

    def serving_relay(self, worker: int) -> tuple[str, Placement]:
        """(resources field, placement) of the relay worker `worker` pulls from first: its
        child relay (worker i: child i mod relay.children), else the root."""
        assert self.resources is not None
        if self.rollout.relays or not self.relay.children:
            return "relay", self.resources.relay
        k = worker % self.relay.children
        return f"relay_children[{k}]", self.resources.child_relay(k)

    @property
    def child_relay_addresses(self) -> list[str]:
        """host:port of the child relays `relayrl up` starts (relay.children): each on its
        node's address when resources places it on another node than the root, else on the
        root's host."""
        out = []
        for k in range(self.relay.children):
            host = self.relay.endpoint.host
            if self.resources is not None:
                node = self.resources.child_relay(k).node
                if node != self.resources.relay.node:
                    host = self.resources.nodes[node].address
            out.append(f"{host}:{self.relay.children_base_port + k}")
        return out

    @property
    def relay_addresses(self) -> list[str]:
        """The relays this worker pulls from, in order of preference: rollout.relays if set;
        else its child relay (worker i: child i mod relay.children), then the root."""
        if self.rollout.relays:
            return list(self.rollout.relays)
        children = self.child_relay_addresses
        own = [children[self.rollout.worker_index % len(children)]] if children else []
        return own + [self.relay.endpoint.address]

    @property
    def inflight_limit(self) -> int:
        """Prompts allowed out at once (relayrl.config.services.inflight_limit)."""
        return inflight_limit(self.scheduler, self.buffer.groups_per_batch,
                              self.trainer.max_staleness)

    @property
    def repack_capacity(self) -> int:
        """Sequences a worker runs at once, for repacking; 0 when repacking is off."""
        if not self.scheduler.repack:
            return 0
        return self.rollout.max_active_groups * self.buffer.group_size

    def prompt_window(self) -> PromptWindow:
        """The longest prompt the configured engine takes (PromptTerms.window)."""
        return self.prompt_terms().window(self.model)

    # -- each service's part (relayrl.config.services) --------------------------------------

    def common(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in RunCommon.model_fields}

    def prompt_terms(self) -> PromptTerms:
        e = self.rollout.engine
        return PromptTerms(max_new_tokens=self.rollout.max_new_tokens,
                           max_prompt_tokens=self.rollout.max_prompt_tokens,
                           max_model_len=e.max_model_len if isinstance(e, VllmEngineConfig)
                           else 0)

    def live_defaults(self) -> LiveDefaults:
        return LiveDefaults(max_staleness=self.trainer.max_staleness,
                            temperature=self.rollout.temperature)

    def group_terms(self) -> GroupTerms:
        return GroupTerms(group_size=self.buffer.group_size,
                          groups_per_batch=self.buffer.groups_per_batch)

    def metric_sinks(self) -> MetricSinks:
        return MetricSinks(tensorboard=self.trainer.tensorboard, wandb=self.trainer.wandb)

    def relay_link(self) -> RelayLink:
        return RelayLink(addresses=self.relay_addresses, chunk_bytes=self.relay.chunk_bytes,
                         timeout_s=self.relay.timeout_s)

    def trainer_terms(self) -> TrainerTerms:
        t = self.trainer
        return TrainerTerms(lora=t.lora, max_steps=t.max_steps, torch_threads=t.torch_threads)

    def scheduler_part(self) -> SchedulerRun:
        return SchedulerRun(**self.common(), scheduler=self.scheduler, groups=self.group_terms(),
                            live=self.live_defaults(), prompts=self.prompt_terms(),
                            repack_capacity=self.repack_capacity)

    def trainer_part(self) -> TrainerRun:
        relay = self.relay
        publish = PublishTarget(address=relay.endpoint.address, chunk_bytes=relay.chunk_bytes,
                                timeout_s=relay.timeout_s,
                                shm_dir=relay.shm_dir if self.trainer.publish_plane == "shm"
                                else None)
        return TrainerRun(**self.common(), trainer=self.trainer, eval=self.eval,
                          generation=self.generation, publish=publish, live=self.live_defaults(),
                          prompts=self.prompt_terms())

    @property
    def generation(self) -> Generation:
        r = self.rollout
        return Generation(max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                          environment=r.environment)

    def buffer_part(self) -> BufferRun:
        return BufferRun(**self.common(), buffer=self.buffer, live=self.live_defaults())

    def relay_part(self) -> RelayRun:
        return RelayRun(**self.common(), relay=self.relay)

    def eval_part(self) -> EvalRun:
        return EvalRun(**self.common(), eval=self.eval, relays=self.relay_link(),
                       weight_plane=self.rollout.weight_plane,
                       torch_threads=self.rollout.torch_threads, follows=self.trainer_terms(),
                       prompts=self.prompt_terms(), generation=self.generation,
                       sinks=self.metric_sinks())

    def rollout_part(self) -> RolloutRun:
        r, s, b = self.rollout, self.scheduler, self.buffer
        lease = LeaseTerms(address=s.endpoint.address, call_timeout_s=s.call_timeout_s,
                           heartbeat_interval_s=s.heartbeat_interval_s,
                           lease_ttl_s=s.lease_ttl_s, max_start_lag=s.max_start_lag,
                           repack_below=s.repack_below, repack_capacity=self.repack_capacity)
        return RolloutRun(**self.common(), rollout=r, bench=self.bench,
                          groups=self.group_terms(),
                          submit=SubmitTerms(address=b.endpoint.address,
                                             reward_range=b.reward_range,
                                             max_pending_samples=b.max_pending_samples),
                          lease=lease, relays=self.relay_link(), live=self.live_defaults(),
                          prompts=self.prompt_terms(), lora=self.trainer.lora,
                          vllm_transfer=(self.vllm_transfer(r.worker_index)
                                         if r.weight_plane == "vllm" else None),
                          routing_replay=self.trainer.routing_replay)

    def part(self, service: str) -> ServicePart:
        """What `python -m <service>` is handed: the service's part (relayrl.config.services)."""
        parts = {"trainer_svc": self.trainer_part, "scheduler_svc": self.scheduler_part,
                 "buffer_svc": self.buffer_part, "relay_svc": self.relay_part,
                 "eval_svc": self.eval_part, "rollout_svc": self.rollout_part}
        if service not in parts:
            raise ValueError(f"service {service!r} has no part of the config; one of "
                             f"{sorted(parts)}")
        return parts[service]()



def load_run_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML run config, apply `section.field=value` overrides, validate. A file with
    no settings at all (empty, or comments only) is refused: it would run every default, the
    tiny addition task, which is rarely what a user who wrote it meant; `{}` asks for that."""
    data = read_yaml(path, allow_empty=False)
    data = apply_overrides(data, list(overrides or []))
    return load_model(RunConfig, data, str(path))


__all__ = ["ConfigError", "PromptWindow", "RunConfig", "load_run_config"]
