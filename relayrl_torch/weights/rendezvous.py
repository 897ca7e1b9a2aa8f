"""The worker's side of a torch_dist or nccl transfer's rendezvous: a torch.distributed Store
whose every operation is a Relay.Rendezvous call on the relay's authenticated gRPC channel,
on the store the relay keeps for that one transfer (relay_svc/rendezvous.py). A caller without
the run's token is refused there, and no store port is open for one to try.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Callable

import torch.distributed as dist

from relayrl.contracts.proto.v1 import relay_pb2

Op = relay_pb2.RendezvousRequest


class RelayStore(dist.Store):
    """`call`: the relay's Rendezvous method, taking (request, timeout=seconds)."""

    def __init__(self, call: Callable, rendezvous_id: str, timeout: datetime.timedelta):
        super().__init__()
        self._call = call
        self._id = rendezvous_id
        self._timeout = timeout

    def _ask(self, op: int, keys: list[str], wait: datetime.timedelta | None = None,
             **fields) -> relay_pb2.RendezvousResponse:
        wait_s = (wait or self._timeout).total_seconds()
        request = relay_pb2.RendezvousRequest(rendezvous_id=self._id, op=op, keys=keys,
                                              timeout_s=wait_s, **fields)
        return self._call(request, timeout=wait_s + 10)  # the relay's own wait ends first

    def set(self, key: str, value) -> None:
        self._ask(Op.OP_SET, [key], value=value.encode() if isinstance(value, str)
                  else bytes(value))

    def get(self, key: str) -> bytes:
        return self._ask(Op.OP_GET, [key]).value

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self._ask(Op.OP_WAIT, list(keys), timeout)

    def check(self, keys: list[str]) -> bool:
        return self._ask(Op.OP_CHECK, list(keys)).ready

    def add(self, key: str, amount: int) -> int:
        return self._ask(Op.OP_ADD, [key], amount=amount).count


def split_address(address: str) -> str:
    """The host of a gRPC target `host:port` (`[v6]:port` too)."""
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host


def local_address_towards(host: str) -> str:
    """This machine's address on the route to `host`: where a rank that `host` dials back
    listens, rather than on every interface. No packet is sent (a UDP socket's connect only
    picks the route)."""
    family, _, _, _, peer = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(peer)
        return probe.getsockname()[0]
