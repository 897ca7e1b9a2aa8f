"""The publish row of bench/weights.py: one version sent to a relay process over gRPC and
handed over through shared memory (trainer.publish_plane shm), in wall and CPU seconds (the
publisher's and the relay's together), against a plain in-memory copy of the same bytes
(the least a handoff can cost: the bytes are written once). The two paths alternate for
`rounds` rounds and the median of each is reported.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from bench.common import trainer_keys
from relayrl_torch.weights.client import RelayClient


def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process `pid` so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _one(address: str, shm_dir: str | None, version: int, payload: dict[str, torch.Tensor],
         relay_pid: int) -> tuple[float, float]:
    client = RelayClient(address, timeout_s=300, publish_shm_dir=shm_dir, keys=trainer_keys())
    cpu0 = _cpu_s(os.getpid()) + _cpu_s(relay_pid)
    t0 = time.perf_counter()
    client.publish(version, version, payload)
    wall = time.perf_counter() - t0
    cpu = _cpu_s(os.getpid()) + _cpu_s(relay_pid) - cpu0
    if shm_dir is not None and client.publish_shm_dir is None:
        raise RuntimeError("the relay took no handoff: the shm row would measure gRPC")
    client.close()
    return wall, cpu


def publish_row(address: str, relay_pid: int, shm_dir: str, payload: dict[str, torch.Tensor],
                copy_s: float, mb: int, rounds: int = 3) -> dict:
    version = RelayClient(address, keys=trainer_keys()).manifest(0).version + 1
    runs: dict[str, list[tuple[float, float]]] = {"grpc": [], "shm": []}
    for _ in range(rounds):
        for path in ("grpc", "shm"):
            runs[path].append(_one(address, shm_dir if path == "shm" else None, version,
                                   payload, relay_pid))
            version += 1
    out = {}
    for path, got in runs.items():
        out[f"publish_{path}_s"] = round(statistics.median(w for w, _ in got), 3)
        out[f"publish_{path}_cpu_s"] = round(statistics.median(c for _, c in got), 3)
    out["publish_shm_speedup"] = round(out["publish_grpc_s"] / out["publish_shm_s"], 2)
    out["publish_shm_over_copy"] = round(out["publish_shm_s"] / copy_s, 2)
    print(f"[{mb} MB] publish to the relay: gRPC {out['publish_grpc_s']:.2f} s "
          f"({out['publish_grpc_cpu_s']:.2f} CPU s), shared-memory handoff "
          f"{out['publish_shm_s']:.2f} s ({out['publish_shm_cpu_s']:.2f} CPU s): "
          f"{out['publish_shm_speedup']}x faster, {out['publish_shm_over_copy']}x a plain "
          "copy", flush=True)
    return out
