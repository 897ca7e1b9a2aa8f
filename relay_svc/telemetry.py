"""What a relay exports on /metrics: its version store's counters and holdings."""

from __future__ import annotations

from dataclasses import dataclass

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


def relay_metrics(store: VersionStore) -> ServiceMetrics:
    def read() -> tuple[RelayStats]:
        versions = store.versions()
        return (RelayStats.from_attributes(
            store.stats, latest_version=max(versions, default=0),
            pending_version=store.pending_version(), versions_held=len(versions)),)

    return ServiceMetrics((RelayStats,), read)
