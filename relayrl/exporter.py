"""Prometheus export of a service's live figures: `GET /metrics` and `GET /healthz`.

A service declares what it exports as a table of `MetricSpec`s named hierarchically, as in
metrics.jsonl (`rollout/tokens_generated`, `weights/pull_s`), plus a `snapshot()` that reads
its live objects. Nothing is counted twice: the collector calls the snapshot at scrape time
and turns each declared name into a Prometheus-legal one (`relayrl_rollout_tokens_generated_
total`, `relayrl_weights_pull_seconds`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)
PREFIX = "relayrl_"

# A snapshot maps a spec's name to a number, or, for a spec with a `label`, to
# {label value: number}; a name it leaves out is not exported this scrape.
Snapshot = Mapping[str, float | Mapping[str, float]]


@dataclass(frozen=True)
class MetricSpec:
    name: str  # hierarchical: section/figure, seconds end in _s, rates in _per_s
    kind: Literal["counter", "gauge"]
    help: str
    label: str | None = None  # the value is a mapping keyed by this label (e.g. "worker")

    @property
    def prometheus_name(self) -> str:
        return prometheus_name(self.name)

    @property
    def sample_name(self) -> str:
        """The name a scrape shows and a query uses (counters end in _total)."""
        return self.prometheus_name + ("_total" if self.kind == "counter" else "")


def prometheus_name(name: str) -> str:
    """`weights/pull_s` -> `relayrl_weights_pull_seconds`; Prometheus wants base units
    spelled out and no slashes."""
    base = re.sub(r"[^a-zA-Z0-9_]", "_", name)
    if base.endswith("_per_s"):
        base = base[:-len("_per_s")] + "_per_second"
    elif base.endswith("_s"):
        base = base[:-len("_s")] + "_seconds"
    return PREFIX + base


@dataclass(frozen=True)
class ServiceMetrics:
    """What a service hands its ServiceRunner to export; `labels` go on every sample (the
    runner adds `service`, its own name, unless they name it)."""

    specs: tuple[MetricSpec, ...]
    snapshot: Callable[[], Snapshot]
    labels: Mapping[str, str] = field(default_factory=dict)


# Every service exports these, filled in by the ServiceRunner itself.
RUNNER_METRICS = (
    MetricSpec("service/up", "gauge", "1 while the service's gRPC health says SERVING."),
    MetricSpec("service/uptime_s", "gauge", "Seconds since the service process started."),
)


class SnapshotCollector(Collector):
    def __init__(self, specs: Iterable[MetricSpec], snapshot: Callable[[], Snapshot],
                 labels: Mapping[str, str]):
        self.specs = tuple(specs)
        self.snapshot = snapshot
        self.label_names = list(labels)
        self.label_values = list(labels.values())

    def describe(self) -> list[Metric]:
        return []  # registering must not call the snapshot

    def collect(self) -> Iterable[Metric]:
        try:
            values = self.snapshot()
        except Exception as err:  # a scrape must never take the service down
            log.warning("metrics snapshot failed: %s", err)
            return
        for spec in self.specs:
            value = values.get(spec.name)
            if value is None:
                continue
            family = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            if spec.label is None:
                metric = family(spec.prometheus_name, spec.help, labels=self.label_names)
                metric.add_metric(self.label_values, float(value))
            else:
                metric = family(spec.prometheus_name, spec.help,
                                labels=[*self.label_names, spec.label])
                for key, v in sorted(value.items()):
                    metric.add_metric([*self.label_values, str(key)], float(v))
            yield metric


def build_app(registry: CollectorRegistry, is_serving: Callable[[], bool]):
    """The ASGI app: /metrics in the Prometheus text format, /healthz 200 while serving."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    # plain functions: Starlette runs them on its thread pool, off the event loop
    def metrics(_request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def healthz(_request) -> Response:
        if is_serving():
            return PlainTextResponse("serving\n")
        return PlainTextResponse("not serving\n", status_code=503)

    return Starlette(routes=[Route("/metrics", metrics), Route("/healthz", healthz)])


class MetricsEndpoint:
    """/metrics and /healthz of one service on host:port, on a background thread."""

    def __init__(self, service: str, host: str, port: int, exported: ServiceMetrics | None,
                 is_serving: Callable[[], bool]):
        from relayrl.http_server import BackgroundHTTPServer

        started = time.monotonic()
        labels = {"service": service, **(exported.labels if exported else {})}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(
            RUNNER_METRICS,
            lambda: {"service/up": float(is_serving()),
                     "service/uptime_s": time.monotonic() - started},
            labels))
        if exported is not None:
            self.registry.register(SnapshotCollector(exported.specs, exported.snapshot,
                                                     labels))
        self.http = BackgroundHTTPServer(build_app(self.registry, is_serving), host, port,
                                         f"{service}-metrics")
        self.address = self.http.address

    def start(self) -> None:
        self.http.start()

    def stop(self) -> None:
        self.http.stop()
