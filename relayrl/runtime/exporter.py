"""Prometheus export of a service's live figures: `GET /metrics` and `GET /healthz`.

A service declares what it exports as `Stats` dataclasses (relayrl.runtime.stats), named
hierarchically as in metrics.jsonl (`rollout/tokens_generated`, `weights/pull_s`), plus a
`read()` that fills them from its live objects. Nothing is counted twice: the collector reads
them at scrape time and turns each declared name into a Prometheus-legal one
(`relayrl_rollout_tokens_generated_total`, `relayrl_weights_pull_seconds`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from relayrl.runtime.stats import Figure, MetricSpec, Stats, gauge, specs_of

log = logging.getLogger(__name__)

# A snapshot maps a spec's name to a number, or, for a spec with a `label`, to
# {label value: number}; a name it leaves out is not exported this scrape.
Snapshot = Mapping[str, Figure]


@dataclass(frozen=True)
class ServiceMetrics:
    """What a service hands its ServiceRunner to export: the Stats classes it declares and a
    `read` that fills them now; `labels` go on every sample (the runner adds `service`, its
    own name, unless they name it)."""

    kinds: tuple[type[Stats], ...]
    read: Callable[[], Iterable[Stats]]
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def specs(self) -> tuple[MetricSpec, ...]:
        return specs_of(self.kinds)

    def snapshot(self) -> dict[str, Figure]:
        return {name: value for stats in self.read()
                for name, value in stats.exported_figures().items()}


@dataclass
class RunnerStats(Stats, section="service"):
    """Every service exports these, filled in by the ServiceRunner itself."""

    up: float = gauge("1 while the service's gRPC health says SERVING.")
    uptime_s: float = gauge("Seconds since the service process started.")


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
        from relayrl.runtime.http_server import BackgroundHTTPServer

        started = time.monotonic()
        labels = {"service": service, **(exported.labels if exported else {})}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(
            RunnerStats.specs(),
            lambda: RunnerStats(up=float(is_serving()),
                                uptime_s=time.monotonic() - started).figures(),
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
