"""The run-wide routes of the control API: status, pause, resume, graceful stop, live
settings and the trainer's recent metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from relayrl.contracts import control
from relayrl.contracts.control import LiveSettings, SettingsChange
from scheduler_svc.core import SchedulerCore
from scheduler_svc.rest_models import MetricsRecord, RunStateView, StatusView, refusals
from scheduler_svc.run_control import TransitionError
from scheduler_svc.run_status import run_status


def run_routes(api: APIRouter, core: SchedulerCore) -> None:

    @api.get("/status", response_model=StatusView)
    def status():
        """Lease counters, and the run: state, trainer step, versions per worker, buffer
        depth, reward and throughput of the latest step, live settings."""
        run = run_status(core)
        with core.lock:
            c = core.policy.counters
            return StatusView(handed_out=core.policy.handed_out, inflight=core.policy.inflight,
                              finished=core.policy.finished, failed=len(core.policy.failed),
                              leases_granted=c.leases_granted,
                              leases_completed=c.leases_completed,
                              leases_expired=c.leases_expired,
                              leases_released=c.leases_released,
                              leases_recalled=c.leases_recalled, leases_moved=c.leases_moved,
                              done=core.policy.done, run=run)

    def transition(action: str) -> RunStateView:
        try:
            return RunStateView(state=core.set_run_state(action))
        except TransitionError as err:
            raise HTTPException(409, str(err)) from None

    @api.post("/pause", response_model=RunStateView, responses=refusals(409))
    def pause():
        """Hand out no lease until resumed; the leases out finish and are trained."""
        return transition("pause")

    @api.post("/resume", response_model=RunStateView, responses=refusals(409))
    def resume():
        """Hand out leases again after a pause (409 once the run is stopping)."""
        return transition("resume")

    @api.post("/stop", response_model=RunStateView)
    def stop():
        """Graceful stop: no new prompt is handed out; the ones out finish and are trained,
        then the trainer writes its last checkpoint and exits, and the run ends."""
        return transition("stop")

    @api.get("/settings", response_model=LiveSettings)
    def settings():
        with core.lock:
            return core.settings

    @api.patch("/settings", response_model=LiveSettings, responses=refusals(400))
    def change_settings(change: SettingsChange):
        """Change live settings; each is checked against its config field's bounds (422
        names the field). The services pick them up at their next step or lease."""
        return core.change_settings(change)

    @api.get("/metrics", response_model=list[MetricsRecord])
    def metrics(last: Annotated[int, Query(ge=1, le=control.RECENT_METRICS_KEPT)] = 20):
        """The trainer's metrics records of its `last` latest steps, oldest first."""
        return control.read_recent_metrics(core.redis, core.keys, last)
