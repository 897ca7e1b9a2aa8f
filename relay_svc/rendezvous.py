"""The key-value stores the torch_dist and nccl planes' two-rank groups meet through: one per
transfer, in the relay's memory, which the relay's rank uses directly and the worker's rank
reaches over Relay.Rendezvous (relayrl_torch.weights.rendezvous), on the channel that already
carries the run's token. No store listens on a port of its own.

A store is named by a random id handed out in the transfer's ticket, and lives until the
transfer ends; whatever a caller sends is bounded here (keys, their names, values, waits).
"""

from __future__ import annotations

import datetime
import secrets
import threading

import torch.distributed as dist

from relayrl.contracts.proto.v1 import relay_pb2
from relayrl_torch.weights import WeightError

Op = relay_pb2.RendezvousRequest
MAX_KEYS = 64  # a two-rank group's rendezvous sets a handful
MAX_KEY_CHARS = 256
MAX_VALUE_BYTES = 1 << 16  # an address, a NCCL unique id


class UnknownRendezvous(WeightError):
    """No transfer's store has this id (never, or no longer)."""


class RendezvousTimeout(WeightError):
    """The keys waited for did not come in time."""


class Rendezvous:
    def __init__(self, timeout: datetime.timedelta):
        self.timeout = timeout  # the longest a caller may wait on one call
        self._lock = threading.Lock()
        self._stores: dict[str, dist.HashStore] = {}

    def open(self) -> tuple[str, dist.Store]:
        """A new transfer's store and the id the worker names it by."""
        store = dist.HashStore()
        store.set_timeout(self.timeout)
        rendezvous_id = secrets.token_hex(16)
        with self._lock:
            self._stores[rendezvous_id] = store
        return rendezvous_id, store

    def close(self, rendezvous_id: str) -> None:
        with self._lock:
            self._stores.pop(rendezvous_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._stores)

    def serve(self, request: relay_pb2.RendezvousRequest) -> relay_pb2.RendezvousResponse:
        with self._lock:
            store = self._stores.get(request.rendezvous_id)
        if store is None:
            raise UnknownRendezvous("Rendezvous.rendezvous_id: no transfer is open under it "
                                    "(it ended, or never began)")
        keys = _checked_keys(request)
        wait = datetime.timedelta(seconds=min(max(request.timeout_s, 0.0),
                                              self.timeout.total_seconds()))
        if request.op == Op.OP_SET:
            if len(request.value) > MAX_VALUE_BYTES:
                raise WeightError(f"Rendezvous.value: {len(request.value)} bytes, at most "
                                  f"{MAX_VALUE_BYTES}")
            if not store.check(keys) and store.num_keys() >= MAX_KEYS:
                raise WeightError(f"Rendezvous: the store holds {MAX_KEYS} keys, its limit")
            store.set(keys[0], request.value)
            return relay_pb2.RendezvousResponse()
        if request.op == Op.OP_ADD:
            if not store.check(keys) and store.num_keys() >= MAX_KEYS:
                raise WeightError(f"Rendezvous: the store holds {MAX_KEYS} keys, its limit")
            return relay_pb2.RendezvousResponse(count=store.add(keys[0], request.amount))
        if request.op == Op.OP_CHECK:
            return relay_pb2.RendezvousResponse(ready=store.check(keys))
        if request.op in (Op.OP_GET, Op.OP_WAIT):
            try:
                store.wait(keys, wait)
            except (RuntimeError, dist.DistError) as err:
                raise RendezvousTimeout(f"Rendezvous: {keys} not set within "
                                        f"{wait.total_seconds():.0f} s ({err})") from None
            if request.op == Op.OP_WAIT:
                return relay_pb2.RendezvousResponse()
            return relay_pb2.RendezvousResponse(value=store.get(keys[0]))
        raise WeightError(f"Rendezvous.op: {request.op} is not an operation")


def _checked_keys(request: relay_pb2.RendezvousRequest) -> list[str]:
    keys = list(request.keys)
    single = request.op in (Op.OP_SET, Op.OP_GET, Op.OP_ADD)
    if not 1 <= len(keys) <= (1 if single else MAX_KEYS):
        raise WeightError(f"Rendezvous.keys: {len(keys)} given, expected "
                          f"{'one' if single else f'1..{MAX_KEYS}'}")
    for key in keys:
        if not 1 <= len(key) <= MAX_KEY_CHARS:
            raise WeightError(f"Rendezvous.keys: a key of {len(key)} characters, expected "
                              f"1..{MAX_KEY_CHARS}")
    return keys
