"""What the buffer exports on /metrics: its counters, the assembler's state and both
streams' depth, as snapshots the service hands over at scrape time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from relayrl.runtime.exporter import ServiceMetrics
from relayrl.runtime.stats import Stats, counter, gauge


@dataclass
class BufferStats(Stats, section="buffer"):
    samples_read: int = counter("Samples read from the trajectory stream.")
    samples_rejected: int = counter("Trajectory entries that did not decode.")
    groups_assembled: int = counter("Complete groups assembled.")
    groups_duplicate: int = counter("Groups dropped as already batched.")
    batches_emitted: int = counter("Batches appended to the batch stream.")
    groups_submitted: int = counter("External groups accepted by Submit.")
    submits_refused: int = counter(
        "External groups refused by Submit as malformed or out of bounds.")
    submits_stale: int = counter(
        "External groups refused by Submit as older than trainer.max_staleness.")
    submits_repeated: int = counter(
        "Submit retries answered from their request_id, appending nothing.")
    batches_held: int = counter(
        "Polls that held complete batches back: buffer.max_pending_batches unread.")
    redis_oom_refusals: int = counter(
        "Batch appends Redis refused at its memory limit (retried, never dropped).")
    partial_groups: int = gauge("Groups still waiting for samples: 0, since a group enters whole.")
    ready_groups: int = gauge("Complete groups waiting for a batch.")


@dataclass
class StreamStats(Stats, section="buffer"):
    trajectory_stream_len: int = gauge("Samples on the trajectory stream (not yet batched).")
    batch_stream_len: int = gauge(
        "Batches on the batch stream (not yet acknowledged by the trainer).")
    batches_unread: int = gauge("Batches on the batch stream the trainer has not read yet.")


def buffer_metrics(snapshot: Callable[[], tuple[BufferStats, StreamStats]]) -> ServiceMetrics:
    """/metrics of the buffer, read from the snapshots the service takes at scrape time
    (BufferService.stats_snapshot)."""
    return ServiceMetrics((BufferStats, StreamStats), snapshot)
