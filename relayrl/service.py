"""The life cycle every service shares: serve gRPC + health (and optionally Prometheus
/metrics + /healthz over HTTP), run a loop, stop on SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from grpc_health.v1 import health_pb2

from relayrl.exporter import MetricsEndpoint, ServiceMetrics
from relayrl.grpc_util import Registrar, make_server

log = logging.getLogger(__name__)


class ServiceRunner:
    """Starts the gRPC server, marks it SERVING, runs `loop(stop_event)` in the main thread.

    SIGTERM and SIGINT set the stop event; the loop is expected to return promptly, after
    which health goes NOT_SERVING and the server drains for `grace_s`. With `metrics_port`
    set, /metrics (the runner's own figures plus `metrics`) and /healthz are served over HTTP
    on that port of the gRPC host, from start to the end of the drain.
    """

    def __init__(self, name: str, address: str, servicers: list[tuple[Registrar, Any]],
                 metrics: ServiceMetrics | None = None, metrics_port: int = 0):
        self.name = name
        self.address = address
        self.stop_event = threading.Event()
        self.serving = False
        self.server, self.health = make_server(address, servicers)
        self.metrics_endpoint = None
        if metrics_port:
            self.metrics_endpoint = MetricsEndpoint(name, address.rsplit(":", 1)[0],
                                                    metrics_port, metrics, lambda: self.serving)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        # Only a plain flag: the handler runs in the main thread, possibly inside a lock it
        # would need (Event.wait's condition, logging's handler lock) - taking one deadlocks.
        self._signalled = True

    def _relay_signals(self) -> None:
        """Turn the flag set by the signal handler into the stop event, from another thread."""
        while not self.stop_event.is_set():
            if self._signalled:
                self.stop_event.set()
                return
            time.sleep(0.05)

    def run(self, loop: Callable[[threading.Event], None] | None = None, grace_s: float = 2.0):
        self._signalled = False
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        threading.Thread(target=self._relay_signals, name="signals", daemon=True).start()
        if self.metrics_endpoint is not None:  # first: a taken port fails before any work
            self.metrics_endpoint.start()
            log.info("%s metrics on %s/metrics", self.name, self.metrics_endpoint.address)
        self.server.start()
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.serving = True
        log.info("%s serving on %s", self.name, self.address)
        try:
            if loop is None:
                self.stop_event.wait()
            else:
                loop(self.stop_event)
        finally:
            log.info("%s stopping", self.name)
            self.serving = False
            self.health.enter_graceful_shutdown()
            self.server.stop(grace_s).wait()
            if self.metrics_endpoint is not None:
                self.metrics_endpoint.stop()
            log.info("%s stopped", self.name)
