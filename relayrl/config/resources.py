"""Where a run's processes go: the nodes, their GPUs, and the GPUs each service is given.

A run with no `resources` section is not placed: every process sees every GPU of the machine
it runs on (CUDA picks cuda:0 for each). With one, the launcher gives each process exactly
its GPUs (CUDA_VISIBLE_DEVICES), runs the trainer under torchrun when it has several, and
`relayrl check` prints the plan and refuses one that cannot work (relayrl_ops/plan.py). GPU
ids are those nvidia-smi numbers, on the node named.

    resources:
      nodes: [{address: 10.0.0.1, gpus: 8}]
      trainer: {gpus: [0, 1, 2, 3]}     # torchrun, 4 ranks, FSDP2
      relay: {gpus: [4]}                # the nccl plane's copy of a version
      rollout: [{gpus: [4, 5, 6, 7]}]   # 4 workers, one GPU each
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from relayrl.config.base import StrictModel

MAX_NODES = 1024
MAX_GPUS = 64  # on one node


class NodeConfig(StrictModel):
    address: str = Field(
        "127.0.0.1", min_length=1, max_length=253,
        description="The host the other nodes dial this node's services at (a name or an "
        "address of the network the nodes share).")
    gpus: int = Field(0, ge=0, le=MAX_GPUS,
                      description="GPUs on this node, numbered 0.. as nvidia-smi numbers them.")
    gpu_memory_gib: float = Field(
        80.0, gt=0, le=4096,
        description="Memory of each of its GPUs, GiB: the plan refuses to put more on one.")


class Placement(StrictModel):
    node: int = Field(0, ge=0, lt=MAX_NODES, description="Index of the node in resources.nodes.")
    gpus: list[int] = Field(
        default_factory=list, max_length=MAX_GPUS,
        description="GPU ids on that node; [] runs on its CPU.")

    @field_validator("gpus")
    @classmethod
    def _distinct(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError(f"gpus: {value} names a GPU twice")
        if any(g < 0 for g in value):
            raise ValueError(f"gpus: {value}: GPU ids start at 0")
        return value


class ResourcesConfig(StrictModel):
    nodes: list[NodeConfig] = Field(
        default_factory=lambda: [NodeConfig()], min_length=1, max_length=MAX_NODES,
        description="The run's hosts; `relayrl up --node K` starts node K's processes.")
    trainer: Placement = Field(
        default_factory=Placement,
        description="The trainer: several GPUs run it under torchrun, a rank on each.")
    relay: Placement = Field(
        default_factory=Placement,
        description="The root relay: a GPU holds its copy of a version for the nccl plane.")
    relay_children: list[Placement] = Field(
        default_factory=list, max_length=64,
        description="Child relay k of relay.children, in order; empty: each where the root is, "
        "without a GPU.")
    rollout: list[Placement] = Field(
        default_factory=list, max_length=MAX_NODES,
        description="GPUs dealt to the rollout workers in order, "
        "rollout.engine.tensor_parallel_size to a worker (1 for the torch engine): worker 0 "
        "takes an entry's first GPUs; an entry without GPUs is one worker on its node's CPU. "
        "Workers may share a GPU (two entries naming it). Empty: every worker on node 0, "
        "unplaced.")
    evaluator: Placement = Field(default_factory=Placement,
                                 description="The evaluator (eval.mode separate).")
    scheduler: Placement = Field(default_factory=Placement,
                                 description="The scheduler (no GPU).")
    buffer: Placement = Field(default_factory=Placement, description="The buffer (no GPU).")
    torchrun_port: int = Field(
        29500, ge=1, le=65535,
        description="Port the ranks of a trainer on several GPUs meet at on its node "
        "(torchrun's --master-port).")

    @model_validator(mode="after")
    def _placements_exist(self) -> ResourcesConfig:
        """Every placement names a node of `nodes` and GPUs that node has; the scheduler and
        the buffer hold no model, so no GPU."""
        for where, p in self.placements():
            if p.node >= len(self.nodes):
                raise ValueError(f"resources.{where}.node: {p.node}, and resources.nodes has "
                                 f"{len(self.nodes)} (0..{len(self.nodes) - 1})")
            have = self.nodes[p.node].gpus
            if p.gpus and max(p.gpus) >= have:
                raise ValueError(f"resources.{where}.gpus: {p.gpus} on node {p.node}, which "
                                 f"has {have} GPU(s) (resources.nodes[{p.node}].gpus)")
        for name in ("scheduler", "buffer"):
            if getattr(self, name).gpus:
                raise ValueError(f"resources.{name}.gpus: the {name} holds no model; leave "
                                 "it []")
        return self

    def placements(self) -> list[tuple[str, Placement]]:
        """(field path, placement) of every placement, in the order the file has them."""
        out = [(name, getattr(self, name)) for name in
               ("trainer", "relay", "evaluator", "scheduler", "buffer")]
        out += [(f"relay_children[{k}]", p) for k, p in enumerate(self.relay_children)]
        out += [(f"rollout[{k}]", p) for k, p in enumerate(self.rollout)]
        return out

    def workers(self, gpus_per_worker: int) -> list[Placement]:
        """Each rollout worker's placement: the `rollout` entries' GPUs dealt
        `gpus_per_worker` at a time, an entry without GPUs one worker on its node's CPU.
        ValueError when an entry does not divide."""
        out = []
        for k, entry in enumerate(self.rollout):
            if not entry.gpus:
                out.append(Placement(node=entry.node))
                continue
            if len(entry.gpus) % gpus_per_worker:
                raise ValueError(
                    f"resources.rollout[{k}].gpus: {entry.gpus} do not divide into workers of "
                    f"{gpus_per_worker} GPU(s) (rollout.engine.tensor_parallel_size)")
            out += [Placement(node=entry.node, gpus=entry.gpus[i:i + gpus_per_worker])
                    for i in range(0, len(entry.gpus), gpus_per_worker)]
        return out

    def child_relay(self, k: int) -> Placement:
        """Child relay k's placement: its own entry, else the root's node without a GPU."""
        if k < len(self.relay_children):
            return self.relay_children[k]
        return Placement(node=self.relay.node)
