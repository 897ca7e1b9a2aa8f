"""What a relay exports on /metrics: its version store's counters and holdings."""

from __future__ import annotations

from relay_svc.version_store import VersionStore
from relayrl.exporter import MetricSpec, ServiceMetrics

RELAY_METRICS = (
    MetricSpec("relay/latest_version", "gauge", "Newest complete version held (0: none)."),
    MetricSpec("relay/pending_version", "gauge", "Version being received (0: none)."),
    MetricSpec("relay/versions_held", "gauge", "Complete versions held."),
    MetricSpec("relay/versions_published", "counter", "Versions received whole."),
    MetricSpec("relay/failed_publishes", "counter", "Versions that failed to arrive whole."),
    MetricSpec("relay/pulls_served", "counter", "Pulls of a version (any data plane)."),
    MetricSpec("relay/bytes_served", "counter", "Bytes of weights served."),
)


def relay_metrics(store: VersionStore) -> ServiceMetrics:
    def snapshot() -> dict[str, float]:
        versions = store.versions()
        s = store.stats
        return {
            "relay/latest_version": max(versions, default=0),
            "relay/pending_version": store.pending_version(),
            "relay/versions_held": len(versions),
            "relay/versions_published": s.versions_published,
            "relay/failed_publishes": s.failed_publishes,
            "relay/pulls_served": s.pulls_served,
            "relay/bytes_served": s.bytes_served,
        }

    return ServiceMetrics(RELAY_METRICS, snapshot)
