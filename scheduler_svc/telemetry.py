"""What the scheduler exports on /metrics: the lease state machine's counters and state, read
under the core's lock at scrape time."""

from __future__ import annotations

from relayrl.exporter import MetricSpec, ServiceMetrics
from scheduler_svc.core import SchedulerCore

SCHEDULER_METRICS = (
    MetricSpec("scheduler/prompts_handed_out", "counter", "Distinct prompts handed out."),
    MetricSpec("scheduler/prompts_inflight", "gauge",
               "Prompts handed out and neither trained on, dropped nor failed."),
    MetricSpec("scheduler/inflight_limit", "gauge",
               "Most prompts allowed in flight (bounds staleness)."),
    MetricSpec("scheduler/prompts_finished", "gauge",
               "Prompts the trainer has stepped past (trained or dropped)."),
    MetricSpec("scheduler/prompts_failed", "gauge", "Prompts failed after max_attempts."),
    MetricSpec("scheduler/leases_active", "gauge", "Leases held by workers now."),
    MetricSpec("scheduler/leases_granted", "counter", "Leases granted."),
    MetricSpec("scheduler/leases_completed", "counter", "Leases completed."),
    MetricSpec("scheduler/leases_expired", "counter", "Leases that lapsed and were re-issued."),
    MetricSpec("scheduler/leases_released", "counter", "Leases handed back by their worker."),
    MetricSpec("scheduler/leases_recalled", "counter", "Leases recalled by a repack."),
    MetricSpec("scheduler/leases_moved", "counter",
               "Recalled leases taken by the worker the repack chose."),
    MetricSpec("scheduler/leases_unheld", "counter",
               "Leases granted, then absent from their worker's heartbeats: re-issued."),
    MetricSpec("scheduler/partial_groups", "gauge", "Prompts with saved token state."),
    MetricSpec("scheduler/workers", "gauge", "Workers registered."),
    MetricSpec("scheduler/workers_draining", "gauge", "Workers that get no new leases."),
    MetricSpec("scheduler/done", "gauge", "1 once every prompt has been handed out and ended."),
    MetricSpec("scheduler/worker_policy_version", "gauge",
               "Policy version each worker last reported.", label="worker"),
    MetricSpec("scheduler/worker_leases", "gauge", "Leases each worker holds.", label="worker"),
    MetricSpec("scheduler/redis_oom_refusals", "counter",
               "Ledger writes Redis refused for its memory limit (retried, never dropped)."),
)


def scheduler_metrics(core: SchedulerCore) -> ServiceMetrics:
    def snapshot() -> dict:
        p = core.policy
        with core.lock:
            c = p.counters
            return {
                "scheduler/prompts_handed_out": p.handed_out,
                "scheduler/prompts_inflight": p.inflight,
                "scheduler/inflight_limit": p.max_inflight,
                "scheduler/prompts_finished": p.finished,
                "scheduler/prompts_failed": len(p.failed),
                "scheduler/leases_active": len(p.leases),
                "scheduler/leases_granted": c.leases_granted,
                "scheduler/leases_completed": c.leases_completed,
                "scheduler/leases_expired": c.leases_expired,
                "scheduler/leases_released": c.leases_released,
                "scheduler/leases_recalled": c.leases_recalled,
                "scheduler/leases_moved": c.leases_moved,
                "scheduler/leases_unheld": c.leases_unheld,
                "scheduler/partial_groups": len(core.partials),
                "scheduler/workers": len(p.workers),
                "scheduler/workers_draining": len(p.draining),
                "scheduler/done": float(p.done),
                "scheduler/worker_policy_version": {w: s.policy_version
                                                    for w, s in p.workers.items()},
                "scheduler/worker_leases": p.leases_by_worker(),
                "scheduler/redis_oom_refusals": core.redis_oom_refusals,
            }

    return ServiceMetrics(SCHEDULER_METRICS, snapshot)
