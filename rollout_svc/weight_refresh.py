"""Follow the relays' newest weights: pull and load a newer version, or wait a while for one
the scheduler requires."""

from __future__ import annotations

import logging
import threading
import time

import grpc
import torch

from relayrl.weights import WeightError, WeightPlane
from relayrl.weights.layout import flat_size
from rollout_svc.engine import Engine

log = logging.getLogger(__name__)
CATCH_UP_POLL_S = 0.02


class WeightRefresher:
    def __init__(self, engine: Engine, relays: list[WeightPlane]):
        if not relays:
            raise ValueError("rollout.relays: a worker needs at least one relay")
        self.engine = engine
        self.relays = relays
        self.weight_swaps = 0
        self.pull_failures = 0
        self.bytes_pulled = 0
        self.last_pull_s = 0.0
        self.catch_up_timeouts = 0  # leases started below the version the scheduler asked
        self._staging: torch.Tensor | None = None  # receive buffer reused across pulls

    def refresh(self) -> bool:
        """Move to the newest version any relay offers, trying relays in order. A relay that
        is down or serves anything that fails verification is skipped; if none succeeds the
        engine stays, whole, on the version it has. True if the engine moved."""
        for relay in self.relays:
            try:
                manifest = relay.manifest(0)
                if manifest is None or manifest.version <= self.engine.version:
                    return False
                t0 = time.monotonic()
                size = flat_size(manifest)
                if self._staging is None or self._staging.numel() < size:
                    self._staging = torch.empty(size, dtype=torch.uint8)
                tensors = relay.pull(manifest.version, staging=self._staging)
                self.engine.load_weights(tensors, manifest.version)
            except (WeightError, ValueError, grpc.RpcError) as err:
                self.pull_failures += 1
                log.warning("weight refresh from %s failed, still on version %d: %s",
                            getattr(relay, "address", "relay"), self.engine.version, err)
                continue
            self.weight_swaps += 1
            self.bytes_pulled += manifest.total_bytes
            self.last_pull_s = time.monotonic() - t0
            log.info("now on version %d (%.0f ms)", manifest.version, 1e3 * self.last_pull_s)
            return True
        return False

    def catch_up(self, min_version: int, stop: threading.Event, patience_s: float) -> None:
        """Move to at least `min_version` if a relay can serve it within `patience_s`: the
        trainer has already published it; the relay may still be receiving. Past that, go on
        with the version at hand."""
        deadline = time.monotonic() + patience_s
        while self.engine.version < min_version and not stop.is_set():
            if self.refresh():
                continue
            if time.monotonic() > deadline:
                log.warning("still on version %d, below the %d the scheduler asked for; "
                            "generating anyway", self.engine.version, min_version)
                self.catch_up_timeouts += 1
                return
            stop.wait(CATCH_UP_POLL_S)
