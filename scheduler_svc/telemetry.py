"""What the scheduler exports on /metrics: the lease state machine's counters and state, read
under the core's lock at scrape time."""

from __future__ import annotations

from dataclasses import dataclass

from relayrl.runtime.exporter import ServiceMetrics
from relayrl.runtime.stats import Stats, counter, gauge
from scheduler_svc.core import SchedulerCore


@dataclass
class SchedulerStats(Stats, section="scheduler"):
    prompts_handed_out: int = counter("Distinct prompts handed out.")
    prompts_inflight: int = gauge(
        "Prompts handed out and neither trained on, dropped nor failed.")
    inflight_limit: int = gauge("Most prompts allowed in flight (bounds staleness).")
    prompts_finished: int = gauge("Prompts the trainer has stepped past (trained or dropped).")
    prompts_failed: int = gauge("Prompts failed after max_attempts.")
    leases_active: int = gauge("Leases held by workers now.")
    leases_granted: int = counter("Leases granted.")
    leases_completed: int = counter("Leases completed.")
    leases_expired: int = counter("Leases that lapsed and were re-issued.")
    leases_released: int = counter("Leases handed back by their worker.")
    leases_recalled: int = counter("Leases recalled by a repack.")
    leases_moved: int = counter("Recalled leases taken by the worker the repack chose.")
    leases_unheld: int = counter(
        "Leases granted, then absent from their worker's heartbeats: re-issued.")
    partial_groups: int = gauge("Prompts with saved token state.")
    workers: int = gauge("Workers registered.")
    workers_draining: int = gauge("Workers that get no new leases.")
    done: float = gauge("1 once every prompt has been handed out and ended.")
    worker_policy_version: dict[str, int] = gauge(
        "Policy version each worker last reported.", label="worker")
    worker_leases: dict[str, int] = gauge("Leases each worker holds.", label="worker")
    redis_oom_refusals: int = counter(
        "Ledger writes Redis refused for its memory limit (retried, never dropped).")


def scheduler_metrics(core: SchedulerCore) -> ServiceMetrics:
    def read() -> tuple[SchedulerStats]:
        p = core.policy
        with core.lock:
            return (SchedulerStats.from_attributes(
                p.counters, core, prompts_handed_out=p.handed_out,
                prompts_inflight=p.inflight, inflight_limit=p.max_inflight,
                prompts_finished=p.finished, prompts_failed=len(p.failed),
                leases_active=len(p.leases), partial_groups=len(core.saved.partials),
                workers=len(p.workers), workers_draining=len(p.draining), done=float(p.done),
                worker_policy_version={w: s.policy_version for w, s in p.workers.items()},
                worker_leases=p.leases_by_worker()),)

    return ServiceMetrics((SchedulerStats,), read)
