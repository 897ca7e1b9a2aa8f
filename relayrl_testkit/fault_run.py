"""A whole run under a fault schedule: the real stack (relayrl_ops.launcher), the injector
(relayrl_testkit.fault_injector) beside it, and the run's audit at the end."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from relayrl.config import RunConfig
from relayrl.contracts.keys import RunKeys
from relayrl.runtime.redis_conn import connect
from relayrl_ops.audit import AuditReport, audit_redis
from relayrl_ops.launcher import Launcher
from relayrl_testkit.fault_injector import FaultInjector, Outcome
from relayrl_testkit.fault_schedule import LANDING_SLACK_STEPS, Fault, due_steps


@dataclass
class FaultRunResult:
    exit_code: int
    final_step: int
    max_steps: int
    outcomes: list[Outcome]
    audit: AuditReport
    elapsed_s: float
    injector_error: str | None = None

    @property
    def target_reached(self) -> bool:
        return self.exit_code == 0 and self.final_step == self.max_steps

    @property
    def lost(self) -> int:
        """Prompts handed out that ended neither trained, dropped (stale or filtered) nor
        failed: with the run finished, nothing may still be generating or waiting."""
        c = self.audit.counts
        return c["leased"] - c["failed"] - c["trained"] - c["dropped"]

    @property
    def trained_twice(self) -> int:
        """The trainer's own count of prompts it stepped past, beyond the distinct ones."""
        c = self.audit.counts
        return c["trainer_finished"] - c["trained"] - c["dropped"]

    @property
    def clean(self) -> bool:
        return (self.target_reached and self.audit.balanced and self.lost == 0
                and self.trained_twice == 0 and self.injector_error is None
                and all(o.recovery_s is not None for o in self.outcomes))


def run_with_faults(cfg: RunConfig, schedule: list[Fault], steps_per_restart: int,
                    slack: int = LANDING_SLACK_STEPS, timeout_s: float = 900.0,
                    recovery_timeout_s: float = 180.0) -> FaultRunResult:
    """Run `cfg` to its end while `schedule` is carried out, each fault at its due step
    (relayrl_testkit.fault_schedule.due_steps, with `slack`). TimeoutError if the run has not
    ended after `timeout_s` (a wedged run must not hang its caller)."""
    t0 = time.monotonic()
    launcher = Launcher(cfg, show_trainer_output=False)
    injector = FaultInjector(launcher, schedule, due_steps(schedule, steps_per_restart, slack),
                             recovery_timeout_s)
    ended, stop = threading.Event(), threading.Event()
    # watching from before the start: the run may be steps in by the time every service has
    # answered the launcher's health check
    thread = threading.Thread(target=injector.run, args=(ended, stop), name="faults",
                              daemon=True)
    thread.start()
    try:
        try:
            launcher.start()
            code = launcher.wait(timeout_s=timeout_s - (time.monotonic() - t0))
            ended.set()
            # a process killed late may still be coming back: keep restarting it so its
            # recovery is measured too
            while code == 0 and thread.is_alive():
                code = launcher.supervise()
                thread.join(0.1)
        finally:
            ended.set()
            stop.set()
            thread.join(recovery_timeout_s)
        redis = connect(launcher.cfg.redis.url)
        report = audit_redis(redis, cfg.run_id, cfg.trainer.max_steps)
        step = int(redis.get(RunKeys(cfg.run_id).trainer_version) or 0)
        redis.close()
    finally:
        launcher.shutdown()
    return FaultRunResult(code, step, cfg.trainer.max_steps, injector.outcomes, report,
                          round(time.monotonic() - t0, 1),
                          None if injector.error is None else repr(injector.error))


def fault_settings(rounds: int) -> dict[str, dict]:
    """Config sections a run under faults needs, merged over its own: leases that lapse
    soon after their worker dies, enough attempts per prompt and restarts per process for
    `rounds` kills of each."""
    return {
        "scheduler": {"lease_ttl_s": 3.0, "heartbeat_interval_s": 0.3,
                      "max_attempts": 3 + 2 * rounds},
        "restarts": {"max_restarts": rounds + 1, "worker_max_restarts": rounds + 1,
                     "backoff_s": 0.2, "backoff_max_s": 2.0},
    }
