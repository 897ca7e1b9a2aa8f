"""The relay's side of the non-gRPC data planes: each turns a complete stored version into a
ticket a worker can fetch it with. gRPC carries the ticket; the bytes go another way."""

from __future__ import annotations

import datetime
import logging
import threading

import torch

from relay_svc.rendezvous import Rendezvous
from relay_svc.stored_version import StoredVersion
from relayrl.contracts.proto.v1 import relay_pb2
from relayrl_torch.weights import WeightError
from relayrl_torch.weights.collective import (
    Declined,
    backend_for,
    broadcast,
    nccl_device,
    two_rank_group,
)
from relayrl_torch.weights.hostid import host_id
from relayrl_torch.weights.layout import views
from relayrl_torch.weights.nixl_plane import nixl_api

log = logging.getLogger(__name__)

Plane = relay_pb2.DataPlane
MAX_RANKS = 64  # a vLLM worker's tensor-parallel ranks, each a receiver of the version


class RelayPlanes:
    """`device` is where the nccl plane holds versions: a config spec (relay.device), which
    must resolve to CUDA, or a torch.device taken as it is (a test's CPU, gloo standing in)."""

    def __init__(self, enabled: list[str], host: str, transfer_timeout_s: float,
                 device: str | torch.device = "auto", bind: str | None = None):
        self.enabled = set(enabled)
        self.host = host  # what workers dial for a rendezvous
        self.bind = bind or host  # where its listener listens
        self.timeout = datetime.timedelta(seconds=transfer_timeout_s)
        self.rendezvous = Rendezvous(self.timeout)  # the torch_dist and nccl planes' stores
        self.device: torch.device | None = None
        if self.enabled & {"nccl", "vllm"}:
            self.device = device if isinstance(device, torch.device) else nccl_device(
                device, "relay.device", "relay.data_planes")
        self._ipc = None  # relay_svc.vllm_planes.IpcHolds, on the first IPC pull
        self._nixl = None
        if "nixl" in self.enabled:
            # NIXL's native library (UCX) loads here, on the thread that builds the relay
            # before its server threads run, not first inside a request handler, where its
            # load once aborted the whole process (a fresh-clone suite on a loaded machine)
            nixl_api()

    def open(self, stored: StoredVersion, request: relay_pb2.OpenPullRequest
             ) -> relay_pb2.PullTicket:
        name = relay_pb2.DataPlane.Name(request.plane).removeprefix("DATA_PLANE_").lower()
        if name not in self.enabled:
            raise WeightError(f"data plane {name!r} is not enabled on this relay "
                              f"(relay.data_planes: {sorted(self.enabled)})")
        ticket = relay_pb2.PullTicket(manifest=stored.manifest.to_proto(), flat_size=stored.size)
        if request.plane == Plane.DATA_PLANE_SHM:
            ticket.shm.CopyFrom(self._shm(stored, request.host_id))
        elif request.plane == Plane.DATA_PLANE_TORCH_DIST:
            ticket.torch_dist.CopyFrom(self._broadcast(stored, stored.flat))
        elif request.plane == Plane.DATA_PLANE_NCCL:
            ticket.torch_dist.CopyFrom(self._broadcast(stored, stored.on_device(self.device)))
        elif request.plane == Plane.DATA_PLANE_NIXL:
            ticket.nixl.CopyFrom(self._nixl_agent().offer(stored))
        elif request.plane == Plane.DATA_PLANE_VLLM:
            self._vllm(stored, request, ticket)
        else:
            raise WeightError(f"OpenPull.plane: {name!r} has no ticket; use PullBytes")
        return ticket

    def close(self, request: relay_pb2.ClosePullRequest) -> None:
        if request.plane == Plane.DATA_PLANE_NIXL and self._nixl is not None:
            self._nixl.forget(request.version)
        if request.plane == Plane.DATA_PLANE_VLLM and self._ipc is not None:
            self._ipc.release(request.agent_name)

    def _vllm(self, stored: StoredVersion, request: relay_pb2.OpenPullRequest,
              ticket: relay_pb2.PullTicket) -> None:
        """vLLM's weight-transfer engines (relay_svc.vllm_planes): CUDA IPC to a worker of
        one rank on this relay's GPU, NCCL to any other, from the GPU copy checked once
        against the manifest."""
        from relay_svc import vllm_planes

        if not 1 <= request.ranks <= MAX_RANKS:
            raise WeightError(f"OpenPull.ranks: {request.ranks}, expected 1..{MAX_RANKS}")
        aliases = vllm_planes.checked_aliases(stored.manifest, request.aliases)
        flat = stored.on_device(self.device, verified=True)
        pairs = vllm_planes.source_tensors(stored.manifest, views(stored.manifest, flat),
                                           aliases)
        timeout_s = self.timeout.total_seconds()
        if request.ranks == 1 and request.gpu_uuid == vllm_planes.gpu_uuid(self.device):
            uuid, shares = vllm_planes.ipc_shares(pairs)
            if self._ipc is None:
                self._ipc = vllm_planes.IpcHolds()
            ticket.vllm_ipc.CopyFrom(relay_pb2.VllmIpcTicket(
                gpu_uuid=uuid, shares=shares, timeout_s=timeout_s,
                pull_id=self._ipc.hold(flat, timeout_s)))
        else:
            ticket.vllm_nccl.CopyFrom(vllm_planes.nccl_ticket(
                pairs, self.device, self.host, self.bind, request.ranks, timeout_s,
                stored.version))

    def _shm(self, stored: StoredVersion, caller_host: str) -> relay_pb2.ShmTicket:
        if stored.shm_path is None:
            raise WeightError("shared memory needs relay.shm_dir set on the relay")
        if caller_host != host_id():
            raise WeightError("OpenPull.host_id: shared memory needs the worker on the "
                              "relay's host")
        return relay_pb2.ShmTicket(path=stored.shm_path, size=stored.size)

    def _broadcast(self, stored: StoredVersion, flat: torch.Tensor
                   ) -> relay_pb2.TorchDistTicket:
        """A group of two for one pull: rank 0 here broadcasts `flat` (the version in host
        memory for torch_dist, on the relay's GPU for nccl) to the worker that joins through
        the transfer's store (Relay.Rendezvous)."""
        rendezvous_id, store = self.rendezvous.open()
        backend = backend_for(flat.device)

        def serve() -> None:
            try:
                group = two_rank_group(store, 0, backend, self.timeout, self.host)
                broadcast(group, flat if stored.size else torch.empty(0, dtype=torch.uint8,
                                                                      device=flat.device))
            except Declined as err:  # it refused the version's manifest
                log.info("%s send of version %d: %s", backend, stored.version, err)
            except Exception as err:  # the worker gave up or died; it will retry
                log.warning("%s send of version %d failed: %s", backend, stored.version, err)
            finally:
                self.rendezvous.close(rendezvous_id)

        threading.Thread(target=serve, name=f"dist-v{stored.version}", daemon=True).start()
        return relay_pb2.TorchDistTicket(backend=backend, rendezvous_id=rendezvous_id,
                                         timeout_s=self.timeout.total_seconds())

    def _nixl_agent(self):
        if self._nixl is None:
            from relay_svc.nixl_server import NixlServer

            self._nixl = NixlServer(lease_s=self.timeout.total_seconds())
        return self._nixl

    def shutdown(self) -> None:
        if self._nixl is not None:
            self._nixl.close()
        if self._ipc is not None:
            self._ipc.close()
