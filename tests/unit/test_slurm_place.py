"""A run config placed on a Slurm job's hosts: node K gets the K-th host, the four served
services follow their nodes, a one-node config stays as written, and a job with fewer hosts
than the config's nodes is refused naming both counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from relayrl.config import RunConfig
from relayrl_ops.plan import plan
from relayrl_ops.slurm import main, place

ROOT = Path(__file__).resolve().parents[2]
TWO_NODES = yaml.safe_load((ROOT / "examples/gpu/two_nodes.yaml").read_text())


def test_two_nodes_are_placed_on_the_jobs_hosts():
    placed = place(TWO_NODES, ["gpu-a", "gpu-b"])
    assert [n["address"] for n in placed["resources"]["nodes"]] == ["gpu-a", "gpu-b"]
    for name in ("relay", "scheduler", "buffer", "trainer"):
        assert placed[name]["endpoint"]["host"] == "gpu-a"  # the example puts them on node 0
    cfg = RunConfig.model_validate(placed)
    on_b = [p for p in plan(cfg) if p.node == 1]
    assert on_b and all(p.address.startswith("gpu-b:") for p in on_b if p.address)
    assert TWO_NODES["resources"]["nodes"][0]["address"] == "10.0.0.1"  # not changed


def test_one_node_stays_as_written():
    tiny = yaml.safe_load((ROOT / "examples/tiny_cpu.yaml").read_text())
    assert place(tiny, ["node-1", "node-2"]) == tiny


def test_fewer_hosts_than_nodes_are_refused():
    with pytest.raises(ValueError, match=r"on 2 nodes, the job has 1 \(gpu-a\).*--nodes=2"):
        place(TWO_NODES, ["gpu-a"])


def test_the_command_writes_a_config_that_loads(capsys):
    assert main([str(ROOT / "examples/gpu/two_nodes.yaml"), "h0", "h1"]) == 0
    RunConfig.model_validate(yaml.safe_load(capsys.readouterr().out))
