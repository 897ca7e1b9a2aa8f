"""Concurrent custom-rollout requests run together: one engine call for many callers.

Agents send one prompt per request, often from many threads at once; run one by one, each
engine call would see a handful of sequences. Here a request waits in a queue while the
engine is busy, and the next call takes every queued request with the same sampling settings
(up to a sequence budget), so batches grow with load. A short wait before each call (a
few milliseconds) lets callers that were just answered send their next requests in time.
Seeded requests run alone: their seed fixes the randomness of their own sequences only.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from relayrl_torch.sampling.sampler import Completion
from rollout_svc.engines.api import Engine, SamplingSpec


@dataclass
class _Pending:
    contexts: list[list[int]]
    spec: SamplingSpec
    done: threading.Event = field(default_factory=threading.Event)
    version: int = -1
    outs: list[Completion] | None = None
    error: BaseException | None = None


class RequestBatcher:
    def __init__(self, engine: Engine, max_batch_seqs: int = 256, wait_s: float = 0.0):
        if max_batch_seqs < 1:
            raise ValueError(f"max_batch_seqs: must be >= 1, got {max_batch_seqs}")
        if wait_s < 0:
            raise ValueError(f"batch_wait_ms: must be >= 0, got {wait_s * 1e3}")
        self.engine = engine
        self.max_batch_seqs = max_batch_seqs
        self.wait_s = wait_s
        self._queue: deque[_Pending] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self.batches = 0
        self.requests = 0

    def generate(self, contexts: list[list[int]], spec: SamplingSpec
                 ) -> tuple[int, list[Completion]]:
        """(version, one completion per context), all under the same version."""
        item = _Pending(contexts, spec)
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="rollout-batcher",
                                                daemon=True)
                self._thread.start()
            self._queue.append(item)
            self._cv.notify()
        item.done.wait()
        if item.error is not None:
            raise item.error
        assert item.outs is not None
        return item.version, item.outs

    def _queued_seqs(self) -> int:
        return sum(len(item.contexts) for item in self._queue)

    def _take(self) -> list[_Pending]:
        """The oldest request, and every later one that can share its engine call, after
        waiting up to `wait_s` for the batch to fill (callers whose last answers just went out
        are about to send their next requests)."""
        with self._cv:
            while not self._queue:
                self._cv.wait()
            deadline = time.monotonic() + self.wait_s
            while self._queued_seqs() < self.max_batch_seqs:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            first = self._queue.popleft()
            batch, seqs = [first], len(first.contexts)
            if first.spec.seed is not None:
                return batch
            keep: deque[_Pending] = deque()
            while self._queue:
                item = self._queue.popleft()
                if item.spec == first.spec and seqs + len(item.contexts) <= self.max_batch_seqs:
                    batch.append(item)
                    seqs += len(item.contexts)
                else:
                    keep.append(item)
            self._queue = keep
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            contexts = [c for item in batch for c in item.contexts]
            try:
                with self.engine.lock:
                    version = self.engine.version
                    outs = self.engine.generate(contexts, batch[0].spec)
            except BaseException as err:  # every waiter hears of it; the loop goes on
                for item in batch:
                    item.error = err
                    item.done.set()
                continue
            self.batches += 1
            self.requests += len(batch)
            start = 0
            for item in batch:
                item.version = version
                item.outs = outs[start:start + len(item.contexts)]
                start += len(item.contexts)
                item.done.set()
