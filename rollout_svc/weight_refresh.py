"""Follow the relays' newest weights: pull and load a newer version, or wait a while for one
the scheduler requires.

While no relay can be reached (relayrl.runtime.outage.is_outage: down, or hung past its deadline)
the worker asks again only as often as a jittered backoff allows, reports itself unready, and
goes on generating with the weights it has; the wait is logged once, and the recovery.

A relay that did not answer (its host cut off) goes behind the others until its own backoff
has passed, so each pull does not first wait out the deadline of a relay that is gone; the
backoff doubles while it stays away, and it leads again once it answers."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc
import torch

from relayrl.config import ConfigError
from relayrl.runtime.backpressure import Backoff
from relayrl.runtime.outage import Outage, describe, is_outage
from relayrl.runtime.procs import release_freed_memory
from relayrl_torch.weights import WeightError, WeightPlane
from relayrl_torch.weights.layout import flat_size
from relayrl_torch.weights.signing import SignatureError
from rollout_svc.engines.api import Engine

log = logging.getLogger(__name__)
CATCH_UP_POLL_S = 0.005  # the trainer has published it: the relay is a send away
AWAY_FIRST_S, AWAY_MAX_S = 10.0, 300.0  # how long a relay that did not answer is put behind


class WeightRefresher:
    def __init__(self, engine: Engine, relays: list[WeightPlane], outage: Outage | None = None):
        if not relays:
            raise ConfigError("rollout.relays: a worker needs at least one relay")
        self.engine = engine
        self.relays = relays
        self.weight_swaps = 0
        self.pull_failures = 0
        self.signatures_refused = 0  # versions whose manifest the trainer did not sign
        self.bytes_pulled = 0
        self.last_pull_s = 0.0
        self.catch_up_timeouts = 0  # leases started below the version the scheduler asked
        self._staging: torch.Tensor | None = None  # receive buffer reused across pulls
        self.outage = outage or Outage("relay")  # no relay reachable: unready meanwhile
        self._retry_at = 0.0  # during an outage, the next try (monotonic seconds)
        # relay index -> (its backoff, until when it goes behind the others)
        self._away: dict[int, tuple[Backoff, float]] = {}
        self.relays_put_behind = 0

    @property
    def deltas_applied(self) -> int:
        return sum(r.deltas_applied for r in self.relays)

    @property
    def deltas_refused(self) -> int:
        return sum(r.deltas_refused for r in self.relays)

    def _in_order(self) -> list[int]:
        """Relay indices to try: the configured order, those put behind at the end."""
        now = time.monotonic()
        behind = {i for i, (_, until) in self._away.items() if now < until}
        return ([i for i in range(len(self.relays)) if i not in behind]
                + [i for i in range(len(self.relays)) if i in behind])

    def _put_behind(self, i: int, err: Exception) -> None:
        backoff, _ = self._away.get(i) or (Backoff(AWAY_FIRST_S, AWAY_MAX_S), 0.0)
        delay = backoff.next_delay()
        self._away[i] = (backoff, time.monotonic() + delay)
        self.relays_put_behind += 1
        log.warning("relay %s did not answer (%s): asking the others first for %.0f s",
                    getattr(self.relays[i], "address", i), describe(err), delay)

    def refresh(self, stay: Callable[[int], bool] | None = None) -> bool:
        """Move to the newest version any relay offers, trying relays in order. A relay that
        is down or serves anything that fails verification is skipped; if none succeeds the
        engine stays, whole, on the version it has. True if the engine moved. While every
        relay is unreachable, a call before the backoff's next try returns False at once.
        `stay(newest)` true keeps the weights at hand although `newest` is out."""
        if self.outage.down and time.monotonic() < self._retry_at:
            return False
        unreachable: Exception | None = None
        answered = False  # some relay answered, if only to refuse
        for i in self._in_order():
            relay = self.relays[i]
            try:
                manifest = relay.manifest(0)
                self._away.pop(i, None)  # it answered
                if (manifest is None or manifest.version <= self.engine.version
                        or (stay is not None and stay(manifest.version))):
                    self.outage.recovered()
                    return False
                t0 = time.monotonic()
                if getattr(self.engine, "receives_versions", False):  # into vLLM directly
                    self.engine.receive(relay, manifest)
                    t_pulled, pulled = time.monotonic(), manifest.total_bytes
                else:
                    size = flat_size(manifest)
                    if self._staging is None or self._staging.numel() < size:
                        self._staging = torch.empty(size, dtype=torch.uint8)
                    tensors = relay.pull(manifest.version, staging=self._staging)
                    t_pulled, pulled = time.monotonic(), relay.last_pull_bytes
                    self.engine.load_weights(tensors, manifest.version)
                    del tensors
                    release_freed_memory()  # the load's temporaries
            except (WeightError, ValueError, grpc.RpcError) as err:
                self.pull_failures += 1
                self.signatures_refused += isinstance(err, SignatureError)
                if is_outage(err):  # logged once, by the outage, if no relay answers
                    unreachable = unreachable or err
                    if len(self.relays) > 1:
                        self._put_behind(i, err)
                    continue
                log.warning("weight refresh from %s failed, still on version %d: %s",
                            getattr(relay, "address", "relay"), self.engine.version, err)
                answered = True
                continue
            self.outage.recovered()
            self.weight_swaps += 1
            self.bytes_pulled += pulled
            self.last_pull_s = time.monotonic() - t0
            # one line per reload: bench/longtail.py counts them
            log.info("now on version %d from %s (%.0f ms: pull %.0f, load %.0f)",
                     manifest.version, getattr(relay, "address", "relay"),
                     1e3 * self.last_pull_s, 1e3 * (t_pulled - t0),
                     1e3 * (self.last_pull_s - (t_pulled - t0)))
            return True
        if answered or unreachable is None:
            self.outage.recovered()
        else:
            self._retry_at = time.monotonic() + self.outage.failed(unreachable)
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
