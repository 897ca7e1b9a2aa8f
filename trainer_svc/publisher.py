"""Asynchronous publishing with two host-buffer sets, latest wins.

The snapshot of the weights into a host buffer runs in the background, alongside the next
step's forward and backward passes; the training loop waits only if that snapshot is still
running when the optimizer is about to change the weights (`fence`). A second thread sends
snapshots to the relay. While one set is being sent, the next snapshot goes into the other;
if another snapshot arrives before that one was sent, it replaces it (rollouts only ever want
the newest version), so a slow relay never stalls training."""

from __future__ import annotations

import logging
import threading
import time

import torch

from relayrl.weights import WeightPlane

log = logging.getLogger(__name__)


class _Snapshot:
    def __init__(self):
        self.buffers: dict[str, torch.Tensor] = {}
        self.version = 0
        self.step = 0

    def fill(self, version: int, step: int, state: dict[str, torch.Tensor]) -> None:
        for name, t in state.items():
            buf = self.buffers.get(name)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = self.buffers[name] = torch.empty_like(t, device="cpu")
            buf.copy_(t.detach())
        self.version, self.step = version, step

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())


class AsyncPublisher:
    def __init__(self, plane: WeightPlane):
        self.plane = plane
        self._sets = (_Snapshot(), _Snapshot())
        self._cond = threading.Condition()
        self._request: tuple[int, int, dict[str, torch.Tensor]] | None = None
        self._pending: _Snapshot | None = None   # snapshotted, waiting to be sent
        self._sending: _Snapshot | None = None
        self._snapshotted = threading.Event()
        self._snapshotted.set()
        self._closed = False
        self.published_version = 0
        self.versions_published = 0
        self.versions_skipped = 0
        self.bytes_published = 0
        self.failures = 0
        self.last_stall_s = 0.0   # publish() plus the fence that followed it
        self.last_copy_s = 0.0
        self.last_send_s = 0.0
        self._threads = [threading.Thread(target=self._snapshot_loop, name="snapshot",
                                          daemon=True),
                         threading.Thread(target=self._send_loop, name="publish", daemon=True)]
        for t in self._threads:
            t.start()

    def publish(self, version: int, step: int, state: dict[str, torch.Tensor]) -> None:
        """Snapshot `state` and send it, both in the background. The caller must call
        `fence()` before it next modifies `state`."""
        t0 = time.perf_counter()
        self.fence()  # a snapshot still reading the previous state must finish first
        with self._cond:
            self._snapshotted.clear()
            self._request = (version, step, state)
            self._cond.notify_all()
        self.last_stall_s = time.perf_counter() - t0

    def fence(self) -> None:
        """Wait until the last snapshot is taken, so the weights may change."""
        t0 = time.perf_counter()
        self._snapshotted.wait()
        self.last_stall_s += time.perf_counter() - t0

    def _snapshot_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._request is not None or self._closed)
                if self._request is None:
                    return
                version, step, state = self._request
                target = self._sets[1] if self._sending is self._sets[0] else self._sets[0]
                if self._pending is target:  # never sent: the newer version replaces it
                    self._pending = None
                    self.versions_skipped += 1
            t0 = time.perf_counter()
            try:
                target.fill(version, step, state)
            finally:
                self.last_copy_s = time.perf_counter() - t0
                with self._cond:
                    self._request = None
                    self._pending = target
                    self._snapshotted.set()
                    self._cond.notify_all()

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                snap, self._pending = self._pending, None
                self._sending = snap
            t0 = time.perf_counter()
            try:
                self.plane.publish(snap.version, snap.step, snap.buffers)
            except Exception as err:  # a failed publish must not kill training
                log.warning("publish of version %d failed: %s", snap.version, err)
                with self._cond:
                    self.failures += 1
                    self._sending = None
                    self._cond.notify_all()
                continue
            with self._cond:
                self.published_version = snap.version
                self.versions_published += 1
                self.bytes_published += snap.nbytes
                self.last_send_s = time.perf_counter() - t0
                self._sending = None
                self._cond.notify_all()

    def wait(self) -> None:
        """Until the newest version asked for has been sent (or failed)."""
        with self._cond:
            self._cond.wait_for(lambda: self._request is None and self._pending is None
                                and self._sending is None)

    def close(self) -> None:
        self.wait()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()
