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

from relayrl.runtime.exporter import MetricsEndpoint, ServiceMetrics
from relayrl.runtime.grpc_util import MAX_MESSAGE_BYTES, Registrar, make_server
from relayrl.runtime.outage import readiness

log = logging.getLogger(__name__)
# The health service name a liveness probe asks: SERVING from start to the drain, also while
# the process waits out a peer's outage (then "", readiness, is NOT_SERVING): a service that
# is correctly waiting must not be restarted for it.
LIVENESS = "liveness"


class ServiceRunner:
    """Starts the gRPC server, marks it SERVING, runs `loop(stop_event)` in the main thread.

    SIGTERM and SIGINT set the stop event; the loop is expected to return promptly, after
    which health goes NOT_SERVING and the server drains for `grace_s`. With `metrics_port`
    set, /metrics (the runner's own figures plus `metrics`) and /healthz are served over HTTP
    on that port of the gRPC host, from start to the end of the drain. While the process
    waits out a peer's outage (relayrl.runtime.outage.readiness) both report it unready: health
    NOT_SERVING, /healthz 503; health's LIVENESS service stays SERVING.
    """

    def __init__(self, name: str, address: str, servicers: list[tuple[Registrar, Any]],
                 metrics: ServiceMetrics | None = None, metrics_port: int = 0,
                 max_receive_bytes: int = MAX_MESSAGE_BYTES,
                 max_concurrent_rpcs: int | None = None):
        self.name = name
        self.address = address
        self.stop_event = threading.Event()
        self.serving = False
        self.server, self.health = make_server(address, servicers,
                                               max_receive_bytes=max_receive_bytes,
                                               max_concurrent_rpcs=max_concurrent_rpcs)
        self.metrics_endpoint = None
        if metrics_port:
            self.metrics_endpoint = MetricsEndpoint(name, address.rsplit(":", 1)[0],
                                                    metrics_port, metrics,
                                                    lambda: self.serving and readiness.ready)

    def _on_readiness(self, ready: bool) -> None:
        if self.serving:  # the drain's NOT_SERVING stays (health ignores sets after it anyway)
            self.health.set("", health_pb2.HealthCheckResponse.SERVING if ready
                            else health_pb2.HealthCheckResponse.NOT_SERVING)

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
        self.serving = True
        self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        readiness.subscribe(self._on_readiness)  # sets SERVING, or NOT_SERVING while waiting
        log.info("%s serving on %s", self.name, self.address)
        try:
            if loop is None:
                self.stop_event.wait()
            else:
                loop(self.stop_event)
        finally:
            log.info("%s stopping", self.name)
            self.serving = False
            readiness.unsubscribe(self._on_readiness)
            self.health.enter_graceful_shutdown()
            self.server.stop(grace_s).wait()
            if self.metrics_endpoint is not None:
                self.metrics_endpoint.stop()
            log.info("%s stopped", self.name)
