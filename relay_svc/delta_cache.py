"""The relay's deltas between the versions it holds, each computed once per (base, target)
and kept within a byte budget, so that the N workers moving from one version to the next
cost one encoding between them (relayrl_torch.weights.delta)."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from relay_svc.version_store import VersionStore
from relayrl_torch.weights.delta import Delta, encode
from relayrl_torch.weights.manifest import WeightError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Whole:
    """Why a pull gets the whole version instead."""
    reason: str


@dataclass
class DeltaStats:
    deltas_encoded: int = 0
    deltas_served: int = 0
    delta_bytes_served: int = 0
    wholes_served: int = 0  # pulls that named a base and got the whole version
    encode_s: float = 0.0


class DeltaCache:
    """`max_bytes` bounds the payloads held; a delta larger than that alone is not made (its
    pulls get the whole version), and the least recently used go first. 0 turns deltas off."""

    def __init__(self, store: VersionStore, max_bytes: int, wait_timeout_s: float = 60.0):
        if max_bytes < 0:
            raise ValueError(f"relay.delta_cache_bytes must be >= 0, got {max_bytes}")
        self.store = store
        self.max_bytes = max_bytes
        self.wait_timeout_s = wait_timeout_s
        self.stats = DeltaStats()
        self._lock = threading.Lock()
        self._held: OrderedDict[tuple[int, int], Delta | Whole] = OrderedDict()
        self._bytes = 0
        self._making: dict[tuple[int, int], threading.Event] = {}

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def get(self, base: int, target: int) -> Delta | Whole:
        """`target` (complete) as the changes since `base`, or why not."""
        if self.max_bytes == 0:
            return Whole("this relay sends no deltas (relay.delta_cache_bytes is 0)")
        if not 0 < base < target:
            return Whole(f"base version {base} is not older than version {target}")
        key = (base, target)
        while True:
            with self._lock:
                if key in self._held:
                    self._held.move_to_end(key)
                    return self._held[key]
                making = self._making.get(key)
                if making is None:
                    making = self._making[key] = threading.Event()
                    break
            if not making.wait(self.wait_timeout_s):  # another pull is encoding it
                return Whole(f"the delta {base} -> {target} is still being encoded")
        try:
            answer = self._make(base, target)
            with self._lock:
                self._keep(key, answer)
            return answer
        finally:
            with self._lock:
                del self._making[key]
            making.set()

    def _make(self, base: int, target: int) -> Delta | Whole:
        try:
            old, new = self.store.get(base), self.store.get(target)
        except WeightError as err:
            return Whole(str(err))
        t0 = time.monotonic()
        delta = encode(old.manifest, old.flat, new.manifest, new.flat)
        seconds = time.monotonic() - t0
        if delta is None:
            return Whole(f"the changes {base} -> {target} are no smaller than the version")
        if delta.nbytes > self.max_bytes:
            return Whole(f"the delta {base} -> {target} ({delta.nbytes} bytes) exceeds "
                         f"relay.delta_cache_bytes ({self.max_bytes})")
        with self._lock:
            self.stats.deltas_encoded += 1
            self.stats.encode_s += seconds
        log.info("delta %d -> %d: %d of %d bytes (%.0f ms)", base, target, delta.nbytes,
                 new.size, 1e3 * seconds)
        return delta

    def _keep(self, key: tuple[int, int], answer: Delta | Whole) -> None:
        """Under the lock. Deltas from or to versions the store let go are dropped first."""
        held = set(self.store.versions())
        for k in [k for k in self._held if not set(k) <= held]:
            self._drop(k)
        size = answer.nbytes if isinstance(answer, Delta) else 0
        while self._held and self._bytes + size > self.max_bytes:
            self._drop(next(iter(self._held)))
        self._held[key] = answer
        self._bytes += size

    def _drop(self, key: tuple[int, int]) -> None:
        answer = self._held.pop(key)
        if isinstance(answer, Delta):
            self._bytes -= answer.nbytes

    def count(self, answer: Delta | Whole) -> None:
        with self._lock:
            if isinstance(answer, Delta):
                self.stats.deltas_served += 1
                self.stats.delta_bytes_served += answer.nbytes
            else:
                self.stats.wholes_served += 1
