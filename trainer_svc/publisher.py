"""Asynchronous publishing with two host-buffer sets, latest wins.

The snapshot of the weights into a host buffer runs in the background, alongside the next
step's forward and backward passes; the training loop waits only if that snapshot is still
running when the optimizer is about to change the weights (`fence`). A second thread sends
snapshots to the relay. While one set is being sent, the next snapshot goes into the other;
if another snapshot arrives before that one was sent, it replaces it (rollouts only ever want
the newest version), so a slow relay never stalls training. Weights on a GPU are copied into
pinned host buffers on a CUDA stream of their own (trainer_svc.snapshot): the relay only ever
gets CPU tensors, and only finite ones. Weights on the CPU publishing through shared memory
skip the snapshot: the version is written straight into its handoff file
(relayrl_torch.weights.shm_handoff.StagedVersion), which then stands in for the snapshot, so the
trainer holds no host copy of its weights besides the version the relay keeps anyway.

Latest wins, and is never lost: a send that fails because the relay is unreachable or hung
(relayrl.runtime.outage.is_outage) is tried again with jittered backoff until it goes through or a
newer snapshot replaces it, the trainer unready meanwhile; `wait` at the end of the run lasts
until the final version is at the relay, or until the trainer is told to stop. A send the
relay refuses (an invalid or out-of-order version) is logged as an error and not repeated."""

from __future__ import annotations

import logging
import threading
import time

import torch

from relayrl.runtime.outage import Outage, is_outage
from relayrl_torch.weights import WeightPlane
from relayrl_torch.weights.shm_handoff import StagedVersion
from trainer_svc.finite import NonFiniteError, check_finite
from trainer_svc.snapshot import Snapshot, ready_event

log = logging.getLogger(__name__)
STOP_POLL_S = 0.1  # how often a wait for an unreachable relay looks at its stop event


class AsyncPublisher:
    def __init__(self, plane: WeightPlane, outage: Outage | None = None,
                 dtype: torch.dtype | None = None):
        self.plane = plane
        self.relay = outage or Outage("relay")  # logs a wait once; unready meanwhile
        self._sets = (Snapshot(dtype), Snapshot(dtype))  # dtype: what versions ship in
        self._cond = threading.Condition()
        self._request: tuple[int, int, dict[str, torch.Tensor], torch.cuda.Event | None] \
            | None = None
        self._pending: Snapshot | StagedVersion | None = None  # taken, waiting to be sent
        self._sending: Snapshot | StagedVersion | None = None
        self._stages = True  # until the plane turns out to take no staged versions
        self._newest: StagedVersion | None = None  # the newest finite staged version, held
        self._snapshotted = threading.Event()
        self._snapshotted.set()
        self._closed = False
        self._give_up = False  # wait(stop) stopped waiting for an unreachable relay
        self.published_version = 0
        self.versions_published = 0
        self.versions_skipped = 0
        self.bytes_published = 0
        self.failures = 0
        self.refused: NonFiniteError | None = None  # a snapshot that was not finite
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
        self._raise_refused()
        with self._cond:
            self._snapshotted.clear()
            self._request = (version, step, state, ready_event(state))
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
                version, step, state, ready = self._request
                target = self._sets[1] if self._sending is self._sets[0] else self._sets[0]
                if self._pending is target:  # never sent: the newer version replaces it
                    self._pending = None
                    self.versions_skipped += 1
            t0 = time.perf_counter()
            refused, taken = None, None
            try:
                taken = self._stage(version, step, state)
                if taken is None:
                    target.fill(version, step, state, ready)
                    taken = target
                check_finite(taken.buffers if taken is target else taken.tensors(),
                             f"publish version {version}")
            except NonFiniteError as err:  # never sent; publish() and wait() raise it
                refused = err
            finally:
                self.last_copy_s = time.perf_counter() - t0
                with self._cond:
                    self._request = None
                    if refused is None and taken is not None:
                        if self._pending is not None:  # never sent: this one replaces it
                            self._drop(self._pending)
                            self.versions_skipped += 1
                        self._pending = taken
                        if isinstance(taken, StagedVersion):  # the newest, for `shipped`
                            if self._newest is not None:
                                self._newest.release()
                            self._newest = taken.retain()
                    elif refused is not None:
                        self.refused, self.failures = refused, self.failures + 1
                        if isinstance(taken, StagedVersion):
                            taken.release()
                    self._snapshotted.set()
                    self._cond.notify_all()

    def _stage(self, version: int, step: int, state: dict[str, torch.Tensor]
               ) -> StagedVersion | None:
        """The version written where the plane takes it from (CPU weights only); None where
        it must be snapshotted."""
        if not self._stages or any(t.device.type != "cpu" for t in state.values()):
            return None
        staged = self.plane.stage(version, step, state, self._sets[0].dtype)
        if staged is None:
            self._stages = False
        return staged

    def shipped(self, version: int) -> StagedVersion | None:
        """`version` as shipped, its tensors viewing its staged file (no copy), held for the
        caller to release; None unless `version` is the newest staged."""
        with self._cond:
            staged = self._newest
            if staged is None or staged.version != version:
                return None
            return staged.retain()

    def _drop(self, item: Snapshot | StagedVersion) -> None:
        """An item taken and never sent (a snapshot's buffers are reused)."""
        if isinstance(item, StagedVersion):
            item.release()

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                snap, self._pending = self._pending, None
                self._sending = snap
            while snap is not None:
                snap = self._send(snap)

    def _send(self, snap: Snapshot) -> Snapshot | None:
        """One try at sending `snap`; the snapshot to try next (after an outage: the same
        one, or a newer one that replaced it), or None."""
        t0 = time.perf_counter()
        try:
            if isinstance(snap, StagedVersion):
                self.plane.send_staged(snap)
            else:
                self.plane.publish(snap.version, snap.step, snap.buffers)
        except Exception as err:  # a failed publish must not kill training
            with self._cond:
                self.failures += 1
            if is_outage(err):
                return self._after_outage(snap, self.relay.failed(err))
            log.error("the relay refused version %d; it is not sent again (the next version "
                      "will be): %s", snap.version, err)
            self._drop(snap)
            self._sent(None, 0.0)
            return None
        self.relay.recovered()
        self._drop(snap)
        self._sent(snap, time.perf_counter() - t0)
        return None

    def _sent(self, snap: Snapshot | None, send_s: float) -> None:
        with self._cond:
            if snap is not None:
                self.published_version = snap.version
                self.versions_published += 1
                self.bytes_published += snap.nbytes
                self.last_send_s = send_s
            self._sending = None
            self._cond.notify_all()

    def _after_outage(self, snap: Snapshot, delay_s: float) -> Snapshot | None:
        """Wait `delay_s` before the next try, which takes the newest snapshot."""
        with self._cond:
            self._cond.wait_for(lambda: self._give_up, timeout=delay_s)
            if not self._give_up:
                if self._pending is not None:  # never sent: the newer version replaces it
                    self._drop(snap)
                    snap, self._pending = self._pending, None
                    self._sending = snap
                    self.versions_skipped += 1
                return snap
            for item in {id(x): x for x in (self._pending, self._sending) if x}.values():
                self._drop(item)
            self._pending = self._sending = None
            self._cond.notify_all()
        self.relay.abandon()
        return None

    def wait(self, stop: threading.Event | None = None) -> None:
        """Until the newest version asked for is at the relay or was refused by it. While the
        relay is unreachable that lasts until it is back, unless `stop` is set meanwhile:
        then that version is given up (logged) and so is any later wait (close)."""
        with self._cond:
            while not self._idle() and not self._give_up:
                if stop is not None and stop.is_set() and self.relay.down:
                    self._give_up = True
                    newest = self._pending or self._sending
                    log.error("stopping with version %s not at the relay (unreachable for "
                              "%.0f s); the newest it took is %d",
                              newest.version if newest else "?", self.relay.elapsed_s(),
                              self.published_version)
                    self._cond.notify_all()
                    break
                self._cond.wait(STOP_POLL_S if stop is not None else None)
            given_up = self._give_up
        if given_up:  # ready again now, not when the send thread next wakes
            self.relay.abandon()
        self._raise_refused()

    def _idle(self) -> bool:
        return self._request is None and self._pending is None and self._sending is None

    def _raise_refused(self) -> None:
        """NonFiniteError if a snapshot held values that are not finite (never published)."""
        if self.refused is not None:
            raise self.refused

    def close(self) -> None:
        try:
            self.wait()
        finally:
            with self._cond:
                self._closed = True
                given_up = self._give_up
                if self._newest is not None:
                    self._newest.release()
                    self._newest = None
                self._cond.notify_all()
            for t in self._threads:  # a given-up send may be in a call the relay never
                if not (given_up and t.name == "publish"):  # answers, until its deadline
                    t.join()
