"""A run config placed on the nodes of a Slurm job: node K of `resources.nodes` gets the
job's K-th host, and the relay, scheduler, buffer and trainer are served at the address of
the node the config puts each on (rollout workers and child relays follow their nodes
already: relayrl_ops/plan.py). deploy/slurm/relayrl.sbatch runs it once per job:

    python -m relayrl_ops.slurm CONFIG HOST [HOST ...] > placed.yaml

On one host nothing moves off loopback, so a one-node job needs no TLS; several hosts need
what any multi-node run needs (redis.url, and auth.tls unless auth.plaintext_beyond_loopback).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import yaml

from relayrl.config import RunConfig

SERVED = ("relay", "scheduler", "buffer", "trainer")


def place(data: dict, hosts: list[str]) -> dict:
    """`data` (a run config as loaded from YAML) with its nodes on `hosts`; ValueError when
    the config places processes on more nodes than the job has."""
    if not hosts:
        raise ValueError("place: the job has no hosts")
    placed = copy.deepcopy(data)
    resources = placed.get("resources")
    if resources is None or len(resources.get("nodes") or [{}]) == 1:
        return placed  # one node: every service stays where the config binds it
    nodes = resources["nodes"]
    if len(nodes) > len(hosts):
        raise ValueError(f"resources.nodes: the config places processes on {len(nodes)} "
                         f"nodes, the job has {len(hosts)} ({', '.join(hosts)}): submit "
                         f"with --nodes={len(nodes)}")
    for node, host in zip(nodes, hosts, strict=False):
        node["address"] = host
    for name in SERVED:
        at = (resources.get(name) or {}).get("node", 0)
        section = placed.setdefault(name, {})
        section["endpoint"] = {**(section.get("endpoint") or {}), "host": hosts[at]}
    return placed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("hosts", nargs="+")
    args = parser.parse_args(argv)
    placed = place(yaml.safe_load(args.config.read_text()) or {}, args.hosts)
    RunConfig.model_validate(placed)  # refused here, before any node starts
    yaml.safe_dump(placed, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
