"""The two-rank process groups of the torch_dist and nccl data planes, and the one place that
picks their backend from a device.

A group lives for one pull (the idiom TRL and OpenRLHF use to hand weights to vLLM: a
stateless process group over a fresh store, with a NCCL communicator), so workers join and
leave at any time and no global torch.distributed state is touched. Rank 0 holds the
version (the relay) and broadcasts it; rank 1 receives (the worker). The store is the
relay's, reached over its gRPC channel (relay_svc/rendezvous.py), never a TCPStore, which
would listen on every interface and take anyone. gloo's own sockets listen on the address
given (`host`); NCCL's, on the interface NCCL picks (NCCL_SOCKET_IFNAME).

The backend follows the buffer's device: NCCL for CUDA memory, gloo for host memory. On a
machine without CUDA the nccl plane's code therefore runs with gloo standing in, which is how
its group and version logic is tested there; a service configured for the nccl plane refuses
to start without CUDA (`nccl_device`) rather than quietly moving bytes through the host.
"""

from __future__ import annotations

import datetime
import logging
import os

import torch

from relayrl_torch.devices import resolve_device

log = logging.getLogger(__name__)
JOINED = "relayrl/worker-joined"  # b"1": the worker joins; b"0": it declined the ticket


class Declined(RuntimeError):
    """The worker took the ticket and refused what it offered (its manifest): no group."""


def backend_for(device: torch.device) -> str:
    """The collective backend for a buffer on `device`."""
    return "nccl" if device.type == "cuda" else "gloo"


def two_rank_group(store, rank: int, backend: str, timeout: datetime.timedelta,
                   host: str | None = None):
    """Rank `rank` of a two-rank group of `backend` rendezvousing on `store`; gloo listens on
    `host`, an address of this machine the peer can reach."""
    import torch.distributed as dist

    assert rank in (0, 1)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend: {backend!r} is not gloo or nccl")
    # NCCL's communicator setup waits for its peer without a deadline: rank 0 first waits,
    # under the store's timeout, for a worker that took the ticket and may never come
    if rank == 0:
        store.wait([JOINED])
        if store.get(JOINED) != b"1":
            raise Declined("the worker declined the transfer")
    else:
        store.set(JOINED, "1")
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [gloo_device(host)]
        return dist.ProcessGroupGloo(store, rank, 2, options)
    if not dist.is_nccl_available():
        raise ValueError("backend: this torch build has no NCCL (a CPU-only wheel?)")
    # a peer that dies mid-broadcast: torch's watchdog then aborts the communicator (2,
    # CleanUpOnly) instead of ending the whole process (its default), a relay among them
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout  # as torch's own _new_process_group_helper sets it
    return dist.ProcessGroupNCCL(store, rank, 2, options)


def decline(store) -> None:
    """Tell rank 0, waiting on `store` for this worker, that it will not join: the relay
    lets go of the transfer now rather than at its deadline."""
    store.set(JOINED, "0")


def gloo_device(host: str | None):
    """gloo's transport listening on `host` only; where `host` is no address of this machine
    (a name that resolves to a load balancer), on gloo's default, this machine's own name."""
    import torch.distributed as dist

    if host is not None:
        try:
            return dist.ProcessGroupGloo.create_device(hostname=host)
        except RuntimeError as err:
            log.warning("gloo cannot listen on %s (%s); on this machine's own name instead",
                        host, err)
    return dist.ProcessGroupGloo.create_default_device()


def broadcast(group, flat: torch.Tensor) -> None:
    """Rank 0's `flat` into rank 1's, returning once the bytes have arrived (NCCL's wait()
    only orders the current stream, so a CUDA buffer is synchronised too), then release the
    group: it was made for this one transfer."""
    try:
        group.broadcast(flat, 0).wait()
        if flat.is_cuda:
            torch.cuda.current_stream(flat.device).synchronize()
    finally:
        group.shutdown()


def nccl_device(spec: str, field: str, plane_field: str) -> torch.device:
    """The GPU a service configured for the nccl plane keeps its buffer on: `spec` (the value
    of the config field `field`) resolved, which must be CUDA. Called at service start."""
    device = resolve_device(spec, field)
    if device.type != "cuda":
        raise ValueError(
            f"{plane_field}: the 'nccl' plane needs CUDA, and {field}={spec!r} resolves to "
            f"{device} on this machine (torch.cuda.is_available() is "
            f"{torch.cuda.is_available()}); choose torch_dist (gloo) or grpc here")
    return device


def worker_device(plane: str, spec: str, field: str = "rollout.engine.device"
                  ) -> torch.device | None:
    """Where a worker receives weights for `plane` (rollout.weight_plane) given `spec`, the
    value of the config field `field` (rollout.engine.device for the torch engine, auto for
    vLLM; eval.device for the evaluator): a GPU for nccl, else None (the host planes choose
    their own buffers)."""
    if plane != "nccl":
        return None
    return nccl_device(spec, field, "rollout.weight_plane")
