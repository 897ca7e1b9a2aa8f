"""The run's processes, planned before anything starts: what each one runs, on which node
and GPUs, with which environment, command line and ports.

`relayrl up` starts the processes of its node from this plan, `relayrl check` prints it and
the GPU memory each process will hold, and refuses a plan that cannot work
(relayrl/config/resources.py says how a run is placed). A placed run gives every process
exactly its GPUs (CUDA_VISIBLE_DEVICES, empty for a process without one, so a service that
needs none never takes cuda:0), and runs a trainer with several GPUs under torchrun, one
rank per GPU. Without a `resources` section every process inherits the machine's GPUs.

Planning reads only the config: no torch, no CUDA, no model.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from relayrl.config import RunConfig

VISIBLE = "CUDA_VISIBLE_DEVICES"
EVALUATOR = "evaluator"  # eval.mode separate: serves no port


@dataclass(frozen=True)
class Process:
    """One process of the run."""

    name: str  # trainer, relay, relay-child-K, scheduler, buffer, rollout-I, evaluator
    module: str  # the service package it runs as `python -m`
    node: int
    gpus: tuple[int, ...] | None  # its GPUs on the node; None: unplaced (it sees them all)
    overrides: tuple[str, ...]  # `--set` values of its own, on top of the run's config
    address: str  # host:port its health is asked at; "" for the evaluator, which serves none
    ports: dict[str, int] = field(default_factory=dict)  # what it listens on, by setting
    ranks: int = 1  # processes torchrun starts for it (the trainer on several GPUs)
    master_port: int = 0  # torchrun's rendezvous port, with ranks > 1

    @property
    def env(self) -> dict[str, str]:
        """What the plan sets in its environment."""
        if self.gpus is None:
            return {}
        return {VISIBLE: ",".join(str(g) for g in self.gpus)}

    def command(self, config_path: str) -> tuple[str, list[str]]:
        """(module, arguments): it runs as `python -m module arguments...`."""
        args = ["--config", config_path]
        for o in self.overrides:
            args += ["--set", o]
        if self.ranks > 1:
            return "torch.distributed.run", [
                "--nnodes", "1", "--nproc-per-node", str(self.ranks), "--master-addr",
                "127.0.0.1", "--master-port", str(self.master_port), "-m", self.module, *args]
        return self.module, args

    def argv(self, config_path: str) -> list[str]:
        """Its command line, the interpreter first."""
        module, args = self.command(config_path)
        return [sys.executable, "-m", module, *args]


def plan(cfg: RunConfig) -> list[Process]:
    """Every process of the run, on every node, in the order `relayrl up` starts them: the
    relays, scheduler and buffer; the trainer; the workers; the evaluator."""
    c, res = cfg, cfg.resources

    def placed(p) -> tuple[int, tuple[int, ...] | None]:
        return (0, None) if res is None else (p.node, tuple(p.gpus))

    def service(name: str, placement, extra: tuple[str, ...] = ()) -> Process:
        section = getattr(c, name)
        node, gpus = placed(placement)
        ports = {f"{name}.endpoint.port": section.endpoint.port}
        for key in ("metrics_port", "rest_port"):
            if getattr(section, key, 0):
                ports[f"{name}.{key}"] = getattr(section, key)
        return Process(name, f"{name}_svc", node, gpus, extra, section.endpoint.address, ports)

    front = [service("relay", res.relay if res else None),
             service("scheduler", res.scheduler if res else None),
             service("buffer", res.buffer if res else None)]
    # a child relay follows the root and serves its share of the workers
    # (RunConfig.relay_addresses); it publishes nothing, so it gets no trainer token
    for k, address in enumerate(c.child_relay_addresses):
        host, port = address.rsplit(":", 1)
        node, gpus = placed(res.child_relay(k) if res else None)
        overrides = [f"relay.endpoint.port={port}",
                     f"relay.upstream=[{c.relay.endpoint.address!r}]", "relay.children=0",
                     "relay.metrics_port=0"]
        if host != c.relay.endpoint.host:
            overrides.insert(0, f"relay.endpoint.host={host}")
        if res is not None and res.relay_children:  # it has no children of its own to place
            overrides.append("resources.relay_children=[]")
        front.append(Process(f"relay-child-{k}", "relay_svc", node, gpus, tuple(overrides),
                             address, {f"relay.children_base_port+{k}": int(port)}))
    node, gpus = placed(res.trainer if res else None)
    trainer = service("trainer", res.trainer if res else None)
    if gpus is not None and len(gpus) > 1:
        trainer = Process(trainer.name, trainer.module, node, gpus, (), trainer.address,
                          {**trainer.ports, "resources.torchrun_port": res.torchrun_port},
                          ranks=len(gpus), master_port=res.torchrun_port)
    return [*front, trainer, *_workers(cfg), *_evaluator(cfg)]


def _workers(cfg: RunConfig) -> list[Process]:
    r, res = cfg.rollout, cfg.resources
    placements = res.workers(cfg.gpus_per_worker) if res is not None and res.rollout else None
    out = []
    for i in range(r.num_workers):
        overrides = [f"rollout.worker_index={i}"]
        node, gpus = 0, None
        if placements is not None:
            node, gpus = placements[i].node, tuple(placements[i].gpus)
        elif res is not None:
            gpus = ()  # placed run, worker without GPUs
        host = r.host
        if res is not None and len(res.nodes) > 1:  # dialled and registered at its node's
            host = res.nodes[node].address
            overrides.append(f"rollout.host={host}")
        ports = {f"rollout.base_port+{i}": r.base_port + i}
        for key in ("http_base_port", "metrics_base_port"):
            if getattr(r, key):
                ports[f"rollout.{key}+{i}"] = getattr(r, key) + i
        if r.kv_transfer_base_port:
            ports[f"rollout.engine.kv_transfer_base_port+{i}"] = r.kv_transfer_base_port + i
        out.append(Process(f"rollout-{i}", "rollout_svc", node, gpus, tuple(overrides),
                           f"{host}:{r.base_port + i}", ports))
    return out


def _evaluator(cfg: RunConfig) -> list[Process]:
    if not (cfg.eval.mode == "separate" and cfg.eval.every):  # every 0: no evaluation
        return []
    res = cfg.resources
    gpus = None if res is None else tuple(res.evaluator.gpus)
    return [Process(EVALUATOR, "eval_svc", res.evaluator.node if res else 0, gpus, (), "")]


def on_node(processes: list[Process], node: int) -> list[Process]:
    """The processes `relayrl up --node NODE` starts."""
    return [p for p in processes if p.node == node]
