"""What a relay exports on /metrics: its version store's counters and holdings."""

from __future__ import annotations

from dataclasses import dataclass

from relay_svc.delta_cache import DeltaCache
from relay_svc.version_store import VersionStore
from relayrl.runtime.exporter import ServiceMetrics
from relayrl.runtime.stats import Stats, counter, gauge


@dataclass
class RelayStats(Stats, section="relay"):
    latest_version: int = gauge("Newest complete version held (0: none).")
    pending_version: int = gauge("Version being received (0: none).")
    versions_held: int = gauge("Complete versions held.")
    versions_published: int = counter("Versions received whole.")
    failed_publishes: int = counter("Versions that failed to arrive whole.")
    signatures_refused: int = counter(
        "Versions refused (published or followed) whose manifest the trainer did not sign.")
    pulls_served: int = counter("Pulls of a version (any data plane).")
    bytes_served: int = counter("Bytes of weights served.")
    deltas_encoded: int = counter("Deltas between two held versions encoded (once each).")
    deltas_served: int = counter("Pulls answered with the changes since the worker's version.")
    delta_bytes_served: int = counter("Bytes of those deltas.")
    wholes_served: int = counter(
        "Pulls that named the worker's version and got the whole version instead.")
    delta_cache_bytes: int = gauge("Bytes of deltas held.")


def relay_metrics(store: VersionStore, deltas: DeltaCache | None = None) -> ServiceMetrics:
    deltas = deltas or DeltaCache(store, 0)

    def read() -> tuple[RelayStats]:
        versions = store.versions()
        return (RelayStats.from_attributes(
            store.stats, deltas.stats, latest_version=max(versions, default=0),
            pending_version=store.pending_version(), versions_held=len(versions),
            delta_cache_bytes=deltas.held_bytes),)

    return ServiceMetrics((RelayStats,), read)
