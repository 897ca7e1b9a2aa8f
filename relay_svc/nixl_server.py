"""The relay's side of the NIXL data plane (relayrl_torch/weights/nixl_plane.py): each complete
version's flat buffer registered with the relay's agent, and tickets a worker READs it by."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from relay_svc.stored_version import StoredVersion
from relayrl.contracts.proto.v1 import relay_pb2
from relayrl_torch.weights.manifest import WeightError
from relayrl_torch.weights.nixl_plane import DESCRIPTOR, make_agent, nixl_api, nixl_errors


@dataclass
class _Offered:
    stored: StoredVersion
    registration: object | None
    descriptors: bytes
    leases: list[float] = field(default_factory=list)  # deadlines of tickets still out


class NixlServer:
    """The relay's agent. A version stays registered, and its buffer alive, while it is held
    or any ticket for it is still out: freeing memory a worker still reads would let the
    relay's UCX progress thread serve a read from unmapped memory."""

    def __init__(self, lease_s: float = 60.0):
        self._api = nixl_api()
        self._errors = nixl_errors(self._api)
        self._agent = make_agent(self._api, "relay", progress_thread=True)
        self.name = self._agent.name
        self.lease_s = lease_s
        self._lock = threading.Lock()
        self._offered: dict[int, _Offered] = {}  # by id() of the StoredVersion it holds
        self._metadata = self._agent.get_agent_metadata()

    def offer(self, stored: StoredVersion) -> relay_pb2.NixlTicket:
        try:
            return self._offer(stored)
        except self._errors as err:
            raise WeightError(f"NIXL registration of version {stored.version} failed: "
                              f"{type(err).__name__} {err}") from None

    def _offer(self, stored: StoredVersion) -> relay_pb2.NixlTicket:
        with self._lock:
            self._drop_unused()
            offered = self._offered.get(id(stored))
            if offered is None:
                offered = self._offered[id(stored)] = self._register(stored)
            if stored.size:
                offered.leases.append(time.monotonic() + self.lease_s)
            return relay_pb2.NixlTicket(agent_name=self.name, agent_metadata=self._metadata,
                                        descriptors=offered.descriptors)

    def forget(self, version: int) -> None:
        """A worker is done with a ticket for `version`: end the lease that expires first."""
        with self._lock:
            for offered in self._offered.values():
                if offered.stored.version == version and offered.leases:
                    offered.leases.remove(min(offered.leases))
                    break
            self._drop_unused()

    def close(self) -> None:
        with self._lock:
            for offered in self._offered.values():
                if offered.registration is not None:
                    self._agent.deregister_memory(offered.registration)
            self._offered.clear()

    def _register(self, stored: StoredVersion) -> _Offered:
        if not stored.size:
            return _Offered(stored, None, b"")
        registration = self._agent.register_memory(stored.flat)
        self._metadata = self._agent.get_agent_metadata()
        return _Offered(stored, registration,
                        DESCRIPTOR.pack(stored.flat.data_ptr(), stored.size, 0))

    def _drop_unused(self) -> None:
        now = time.monotonic()
        for key, offered in list(self._offered.items()):
            offered.leases = [d for d in offered.leases if d > now]
            if offered.stored.released and not offered.leases:
                if offered.registration is not None:
                    self._agent.deregister_memory(offered.registration)
                    self._metadata = self._agent.get_agent_metadata()
                del self._offered[key]
