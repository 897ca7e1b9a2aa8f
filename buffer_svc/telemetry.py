"""What the buffer exports on /metrics: its counters, the assembler's state and both
streams' depth, read at scrape time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from relayrl.exporter import MetricSpec, ServiceMetrics

if TYPE_CHECKING:  # buffer_svc.server imports this module
    from buffer_svc.server import BufferService

BUFFER_METRICS = (
    MetricSpec("buffer/samples_read", "counter", "Samples read from the trajectory stream."),
    MetricSpec("buffer/samples_rejected", "counter", "Trajectory entries that did not decode."),
    MetricSpec("buffer/groups_assembled", "counter", "Complete groups assembled."),
    MetricSpec("buffer/groups_duplicate", "counter", "Groups dropped as already batched."),
    MetricSpec("buffer/batches_emitted", "counter", "Batches appended to the batch stream."),
    MetricSpec("buffer/groups_submitted", "counter", "External groups accepted by Submit."),
    MetricSpec("buffer/submits_refused", "counter",
               "External groups refused by Submit as malformed or out of bounds."),
    MetricSpec("buffer/submits_stale", "counter",
               "External groups refused by Submit as older than trainer.max_staleness."),
    MetricSpec("buffer/submits_repeated", "counter",
               "Submit retries answered from their request_id, appending nothing."),
    MetricSpec("buffer/batches_held", "counter",
               "Polls that held complete batches back: buffer.max_pending_batches unread."),
    MetricSpec("buffer/redis_oom_refusals", "counter",
               "Batch appends Redis refused at its memory limit (retried, never dropped)."),
    MetricSpec("buffer/partial_groups", "gauge",
               "Groups still waiting for samples: 0, since a group enters whole."),
    MetricSpec("buffer/ready_groups", "gauge", "Complete groups waiting for a batch."),
    MetricSpec("buffer/trajectory_stream_len", "gauge",
               "Samples on the trajectory stream (not yet batched)."),
    MetricSpec("buffer/batch_stream_len", "gauge",
               "Batches on the batch stream (not yet acknowledged by the trainer)."),
    MetricSpec("buffer/batches_unread", "gauge",
               "Batches on the batch stream the trainer has not read yet."),
)


def buffer_metrics(svc: BufferService) -> ServiceMetrics:
    def snapshot() -> dict[str, float]:
        with svc.lock:
            figures = {
                "buffer/samples_read": svc.samples_read,
                "buffer/samples_rejected": svc.samples_rejected,
                "buffer/groups_assembled": svc.asm.groups_assembled,
                "buffer/groups_duplicate": svc.asm.groups_duplicate,
                "buffer/batches_emitted": svc.batches_emitted,
                "buffer/batches_held": svc.batches_held,
                "buffer/redis_oom_refusals": svc.pressure.oom_refusals,
                "buffer/groups_submitted": svc.submissions.accepted,
                "buffer/submits_refused": svc.submissions.refused,
                "buffer/submits_stale": svc.submissions.stale,
                "buffer/submits_repeated": svc.submissions.repeated,
                "buffer/partial_groups": 0,
                "buffer/ready_groups": len(svc.asm.ready),
            }
        # Redis round trips outside the lock: the poll loop needs it
        figures["buffer/trajectory_stream_len"] = svc.pending_samples()
        figures["buffer/batch_stream_len"] = svc.r.xlen(svc.keys.batches)
        figures["buffer/batches_unread"] = svc.unread_batches()
        return figures

    return ServiceMetrics(BUFFER_METRICS, snapshot)
