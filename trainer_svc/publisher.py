"""Asynchronous publishing: the training loop pays only for a copy into host buffers."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from relayrl.weights import WeightPlane

log = logging.getLogger(__name__)


class AsyncPublisher:
    def __init__(self, plane: WeightPlane):
        self.plane = plane
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish")
        self._buffers: dict[str, torch.Tensor] = {}
        self._inflight: Future | None = None
        self._lock = threading.Lock()
        self.published_version = 0
        self.failures = 0
        self.last_stall_s = 0.0
        self.last_send_s = 0.0

    def publish(self, version: int, step: int, state: dict[str, torch.Tensor]) -> None:
        """Snapshot `state` and send it in the background. Blocks only if the previous
        version is still being sent, since its host buffers are about to be reused."""
        t0 = time.perf_counter()
        self.wait()
        for name, t in state.items():
            buf = self._buffers.get(name)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = self._buffers[name] = torch.empty_like(t, device="cpu")
            buf.copy_(t.detach())
        self._inflight = self._pool.submit(self._send, version, step)
        self.last_stall_s = time.perf_counter() - t0

    def _send(self, version: int, step: int) -> None:
        t0 = time.perf_counter()
        try:
            self.plane.publish(version, step, self._buffers)
        except Exception as err:  # a failed publish must not kill training; the next one retries
            with self._lock:
                self.failures += 1
            log.warning("publish of version %d failed: %s", version, err)
            return
        with self._lock:
            self.published_version = version
            self.last_send_s = time.perf_counter() - t0

    def wait(self) -> None:
        if self._inflight is not None:
            self._inflight.result()
            self._inflight = None

    def close(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)
