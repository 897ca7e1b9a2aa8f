"""The worker's side of the non-gRPC data planes: fetch a version's flat buffer given the
ticket the relay handed out over gRPC."""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable

import torch

from relayrl.contracts.proto.v1 import relay_pb2
from relayrl_torch.weights.collective import backend_for, broadcast, decline, two_rank_group
from relayrl_torch.weights.hostid import host_id
from relayrl_torch.weights.manifest import WeightError
from relayrl_torch.weights.rendezvous import RelayStore, local_address_towards

__all__ = ["NixlFetcher", "decline_torch_dist", "fetch_shm", "fetch_torch_dist", "host_id"]


def fetch_shm(ticket: relay_pb2.ShmTicket, flat: torch.Tensor) -> torch.Tensor:
    """Copy the relay's file into `flat` (this process's memory), which the caller then
    verifies. Copied first so that what is checked is what is loaded: the relay recycles a
    dropped version's file for a later version, and a view of the file would change under
    tensors already checked, where a copy taken as it is rewritten fails its checksums."""
    try:
        fd = os.open(ticket.path, os.O_RDONLY)
    except FileNotFoundError:
        raise WeightError(f"shared-memory file {ticket.path} is gone (version dropped)") from None
    with os.fdopen(fd, "rb", buffering=0) as f:
        view, pos = memoryview(flat.numpy()), 0
        while pos < len(view):
            read = f.readinto(view[pos:])
            if not read:
                raise WeightError(f"shared-memory file {ticket.path} holds {pos} bytes, "
                                  f"fewer than {len(view)}")
            pos += read
    return flat


def fetch_torch_dist(ticket: relay_pb2.TorchDistTicket, flat: torch.Tensor,
                     rendezvous: Callable, relay_host: str) -> torch.Tensor:
    """Join a two-rank group with the relay and receive its broadcast into `flat`, whose
    device must call for the backend the relay offers (torch_dist: gloo into host memory;
    nccl: NCCL into GPU memory, or gloo standing in where the relay has no CUDA). The ranks
    meet through `rendezvous`, the relay's Rendezvous method; gloo listens on this machine's
    address towards `relay_host`."""
    if ticket.backend != backend_for(flat.device):
        raise WeightError(f"the relay offers a {ticket.backend} broadcast, and this worker "
                          f"receives on {flat.device}, which needs {backend_for(flat.device)}")
    timeout = datetime.timedelta(seconds=ticket.timeout_s)
    store = RelayStore(rendezvous, ticket.rendezvous_id, timeout)
    try:
        broadcast(two_rank_group(store, 1, ticket.backend, timeout,
                                 local_address_towards(relay_host)), flat)
    except RuntimeError as err:
        raise WeightError(f"torch.distributed receive failed: {err}") from None
    return flat


def decline_torch_dist(ticket: relay_pb2.TorchDistTicket, rendezvous: Callable) -> None:
    """Refuse a ticket taken (its manifest did not verify): the relay's rank stops waiting
    for this worker. Best effort; the relay gives up at its deadline otherwise."""
    import grpc

    timeout = datetime.timedelta(seconds=min(ticket.timeout_s, 10.0))
    try:
        decline(RelayStore(rendezvous, ticket.rendezvous_id, timeout))
    except grpc.RpcError:
        pass


class NixlFetcher:
    """One NIXL agent per client, kept across pulls (agent creation costs a UCX context)."""

    def __init__(self):
        from relayrl_torch.weights.nixl_plane import NixlClient

        self._client = NixlClient()
        self.name = self._client.name

    def fetch(self, ticket: relay_pb2.NixlTicket, size: int, timeout_s: float,
              staging: torch.Tensor | None = None) -> torch.Tensor:
        return self._client.read(ticket, size, timeout_s, staging)
