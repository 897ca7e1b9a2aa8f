"""The nccl row of bench/weights.py: pulls over the nccl plane from a relay process holding
the version on one GPU into a worker's buffer on another, against its ceiling measured in
the same run: a raw NCCL broadcast of the same size between the same two GPUs, its
communicator built beforehand (the plane builds one per pull and verifies what arrives).

NCCL refuses two ranks on one GPU, so the row needs two; elsewhere it is skipped, and
`skip_reason` says why.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import time

import torch

from bench.common import fastest_pull_s, trainer_keys
from relayrl.runtime.grpc_util import free_ports
from relayrl_torch.weights.client import RelayClient
from relayrl_torch.weights.collective import two_rank_group

RELAY_GPU, WORKER_GPU = "cuda:0", "cuda:1"
TIMEOUT = datetime.timedelta(seconds=300)


def skip_reason() -> str | None:
    """Why this machine cannot run the row, or None."""
    if not torch.cuda.is_available():
        return "CUDA is not available on this machine (torch.cuda.is_available() is False)"
    if torch.cuda.device_count() < 2:
        return (f"it needs two GPUs (NCCL refuses two ranks on one GPU); this machine has "
                f"{torch.cuda.device_count()}")
    return None


def _timed_broadcasts(rank: int, port: int, nbytes: int, rounds: int) -> list[float]:
    import torch.distributed as dist

    device = torch.device(RELAY_GPU if rank == 0 else WORKER_GPU)
    torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=TIMEOUT)
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    group = two_rank_group(store, rank, "nccl", TIMEOUT)
    times = []
    for _ in range(rounds + 1):  # the first round builds the communicator
        start = time.perf_counter()
        group.broadcast(flat, 0).wait()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    group.shutdown()
    return times[1:]


def _root(port: int, nbytes: int, rounds: int) -> None:
    _timed_broadcasts(0, port, nbytes, rounds)


def nccl_ceiling_s(nbytes: int, rounds: int = 3) -> float:
    """Best seconds of a raw broadcast of `nbytes` from another process's RELAY_GPU."""
    (port,) = free_ports(1)
    root = mp.get_context("spawn").Process(target=_root, args=(port, nbytes, rounds))
    root.start()
    try:
        return min(_timed_broadcasts(1, port, nbytes, rounds))
    finally:
        root.join(60)


def nccl_row(address: str, nbytes: int, mb: int) -> dict:
    """The plane's pull (group, broadcast, host copy and checksums) against the ceiling."""
    client = RelayClient(address, timeout_s=300, plane="nccl", device=torch.device(WORKER_GPU),
                         keys=trainer_keys())
    # the staging buffer holds the host copy the checksums read
    pull_s = fastest_pull_s(client)
    client.close()
    ceiling = nbytes / nccl_ceiling_s(nbytes) / 1e9
    out = {"nccl_ceiling_gbps": round(ceiling, 3),
           "nccl_pull_gbps": round(nbytes / pull_s / 1e9, 3)}
    out["nccl_ratio"] = round(out["nccl_pull_gbps"] / ceiling, 3)
    print(f"[{mb} MB] raw NCCL broadcast {RELAY_GPU} -> {WORKER_GPU}: {ceiling:.3f} GB/s; "
          f"pull via nccl: {out['nccl_pull_gbps']} GB/s ({out['nccl_ratio']} of it)",
          flush=True)
    return out
