"""What a rollout worker exports on /metrics: its counters, its engine's and its custom-rollout
batcher's, read live at scrape time."""

from __future__ import annotations

from relayrl.exporter import MetricSpec, ServiceMetrics
from rollout_svc.batcher import RequestBatcher
from rollout_svc.worker import RolloutWorker

ROLLOUT_METRICS = (
    MetricSpec("rollout/policy_version", "gauge", "Policy version the engine runs."),
    MetricSpec("rollout/samples_generated", "counter", "Samples scored and appended."),
    MetricSpec("rollout/tokens_generated", "counter",
               "Tokens the engine generated (training rollouts and custom requests)."),
    MetricSpec("rollout/engine_busy_s", "counter", "Seconds the engine spent generating."),
    MetricSpec("rollout/tokens_per_s", "gauge",
               "Tokens generated per second of engine time, since the start."),
    MetricSpec("rollout/tokens_resumed", "counter",
               "Context tokens resumed from a kept KV cache instead of re-prefilled."),
    MetricSpec("rollout/segments", "counter", "Engine calls of the training loop."),
    MetricSpec("rollout/segment_sequences", "counter",
               "Sequences extended by the training loop's engine calls, summed over calls "
               "(over rollout/segments: the mean batch)."),
    MetricSpec("rollout/seats", "gauge",
               "Sequences the training loop runs at once at most (max_active_groups x n)."),
    MetricSpec("rollout/loop_s", "counter",
               "Seconds of the training loop by part: generate, weights, lease, deliver "
               "(including waits for buffer room), save (token state), idle.", label="part"),
    MetricSpec("rollout/mid_sequence_swaps", "counter",
               "Sequences continued under a newer version than they started with."),
    MetricSpec("rollout/groups_resumed", "counter",
               "Leases that came with another worker's token state."),
    MetricSpec("rollout/groups_restarted_stale", "counter",
               "Groups started over: a token had aged past the trainer's staleness bound."),
    MetricSpec("rollout/leases_released", "counter", "Leases handed back unfinished."),
    MetricSpec("rollout/groups_moved_out", "counter", "Groups handed over by a repack."),
    MetricSpec("rollout/kv_imported", "counter", "KV states taken over with a moved group."),
    MetricSpec("rollout/kv_refused", "counter", "KV states of moved groups not usable here."),
    MetricSpec("rollout/custom_requests", "counter", "Custom-rollout requests (gRPC, HTTP)."),
    MetricSpec("rollout/custom_engine_calls", "counter",
               "Engine calls that served custom-rollout requests."),
    MetricSpec("rollout/scheduler_call_failures", "counter",
               "Scheduler calls that failed or passed their deadline."),
    MetricSpec("rollout/buffer_waiting", "gauge",
               "1 while a delivery waits for room in the buffer (buffer.max_pending_samples)."),
    MetricSpec("rollout/buffer_full_waits", "counter",
               "Times a delivery found the buffer full and backed off."),
    MetricSpec("rollout/buffer_full_wait_s", "counter", "Seconds deliveries waited for room."),
    MetricSpec("rollout/redis_oom_refusals", "counter",
               "Appends Redis refused at its memory limit (retried, never dropped)."),
    MetricSpec("rollout/redis_oom_wait_s", "counter",
               "Seconds appends waited for Redis to accept writes again."),
    MetricSpec("weights/swaps", "counter", "Versions pulled and loaded into the engine."),
    MetricSpec("weights/pull_failures", "counter", "Weight refreshes a relay failed."),
    MetricSpec("weights/bytes_pulled", "counter", "Bytes of weights pulled."),
    MetricSpec("weights/pull_s", "gauge", "Seconds the last pull-and-load took."),
)


def rollout_metrics(worker: RolloutWorker, batcher: RequestBatcher) -> ServiceMetrics:
    def snapshot() -> dict[str, float]:
        w = worker
        pressure = w.writer.counters
        engine = w.engine.stats()
        tokens, busy = engine.get("tokens_generated", 0), engine.get("busy_s", 0)
        return {
            "rollout/policy_version": w.engine.version,
            "rollout/samples_generated": w.samples_generated,
            "rollout/tokens_generated": tokens,
            "rollout/engine_busy_s": busy,
            "rollout/tokens_per_s": tokens / busy if busy else 0.0,
            "rollout/tokens_resumed": engine.get("tokens_resumed", 0),
            "rollout/segments": w.segments,
            "rollout/segment_sequences": w.sequences_decoded,
            "rollout/seats": w.seats,
            "rollout/loop_s": dict(w.loop_s),
            "rollout/mid_sequence_swaps": w.mid_sequence_swaps,
            "rollout/groups_resumed": w.groups_resumed,
            "rollout/groups_restarted_stale": w.groups_restarted_stale,
            "rollout/leases_released": w.leases_released,
            "rollout/groups_moved_out": w.groups_moved_out,
            "rollout/kv_imported": w.kv_imported,
            "rollout/kv_refused": w.kv_refused,
            "rollout/custom_requests": batcher.requests,
            "rollout/custom_engine_calls": batcher.batches,
            "rollout/scheduler_call_failures": w.scheduler_call_failures,
            "rollout/buffer_waiting": int(w.writer.waiting_for_room),
            "rollout/buffer_full_waits": pressure.full_waits,
            "rollout/buffer_full_wait_s": pressure.full_wait_s,
            "rollout/redis_oom_refusals": pressure.oom_refusals,
            "rollout/redis_oom_wait_s": pressure.oom_wait_s,
            "weights/swaps": w.weight_swaps,
            "weights/pull_failures": w.pull_failures,
            "weights/bytes_pulled": w.bytes_pulled,
            "weights/pull_s": w.last_pull_s,
        }

    return ServiceMetrics(ROLLOUT_METRICS, snapshot,
                          {"service": "rollout", "worker_id": worker.worker_id})
