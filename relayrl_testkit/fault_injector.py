"""Carries out a fault schedule (relayrl_testkit.fault_schedule) on a run the launcher is
driving: waits for each fault's moment, kills the process with SIGKILL, and measures how long
the run takes to recover. The launcher's restart policy does the restarting; this only
kills and watches.

Recovery seconds: from the kill until both the process answers again (a new process
healthy on its address; Redis answering a ping) and the trainer has recorded a step past
the one it was at when the kill landed. A killed trainer resumes from its last checkpoint,
so its recovery includes replaying the steps since then. A kill that lands once the trainer
has recorded its last step leaves no later step to show: there the process serving again is
the recovery.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

import redis as redis_lib

from relayrl.contracts.keys import RunKeys
from relayrl.runtime.grpc_util import check_health
from relayrl_testkit.fault_schedule import Fault

log = logging.getLogger(__name__)
POLL_S = 0.05


@dataclass
class Outcome:
    fault: Fault
    at_step: int  # the trainer's step when the kill landed
    at_s: float  # seconds into the run
    killed_pid: int
    recovery_s: float | None = None  # None: not recovered within the injector's timeout


class FaultInjector:
    def __init__(self, launcher, schedule: list[Fault], due: list[int],
                 recovery_timeout_s: float = 180.0):
        assert len(due) == len(schedule)
        self.launcher = launcher
        self.schedule = schedule
        self.due = due
        self.recovery_timeout_s = recovery_timeout_s
        self.outcomes: list[Outcome] = []
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self._redis = None

    # -- what the run is doing ----------------------------------------------------------------

    def step(self) -> int | None:
        """The trainer's last recorded step; None while Redis cannot be reached, or before
        the launcher has started it."""
        if self._redis is None:
            cfg = self.launcher.cfg
            if not cfg.redis.url:
                return None
            self._redis = redis_lib.Redis.from_url(cfg.redis.url, socket_timeout=2,
                                                   socket_connect_timeout=2)
        try:
            return int(self._redis.get(RunKeys(self.launcher.cfg.run_id).trainer_version) or 0)
        except redis_lib.RedisError:
            return None

    def _child(self, name: str):
        return next(c for c in self.launcher.children if c.name == name)

    def _pid(self, target: str) -> int:
        if target == "redis":
            return self.launcher.embedded.pid
        return self._child(target).proc.pid

    def _serving_again(self, target: str, killed_pid: int) -> bool:
        if target == "redis":
            server = self.launcher.embedded
            return server.alive() and server.pid != killed_pid and self.step() is not None
        child = self._child(target)
        return (child.proc.pid != killed_pid and child.proc.poll() is None
                and check_health(child.address))

    # -- the schedule ---------------------------------------------------------------------------

    def run(self, ended: threading.Event, stop: threading.Event) -> None:
        """Every fault in order, each at its due step (or the step after the previous one
        recovered, when that is later). Once `ended` is set (the trainer reached its last step) no
        new fault fires, but the last one's recovery is still watched; `stop` gives up."""
        max_steps = self.launcher.cfg.trainer.max_steps
        try:
            last = self._wait_step(lambda s: True, ended)
            for fault, due in zip(self.schedule, self.due, strict=True):
                if last is None:
                    return
                target = max(due, last + 1)
                at = self._wait_step(lambda s, t=target: s >= t, ended)
                if at is None or at >= max_steps or ended.wait(fault.delay_s):
                    return
                last = self._inject(fault, stop)
        except BaseException as err:  # the caller reports it; the run itself goes on
            log.exception("fault injector failed")
            self.error = err

    def _wait_step(self, cond, stop: threading.Event, timeout_s: float | None = None
                   ) -> int | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            step = self.step()
            if step is not None and cond(step):
                return step
            if stop.is_set() or deadline is not None and time.monotonic() > deadline:
                return None
            time.sleep(POLL_S)

    def _inject(self, fault: Fault, stop: threading.Event) -> int | None:
        at_step = self.step() or 0
        pid = self._pid(fault.target)
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        outcome = Outcome(fault, at_step, round(t0 - self.started, 2), pid)
        self.outcomes.append(outcome)
        log.warning("fault %d: killed %s (pid %d) at step %d", fault.index, fault.target, pid,
                    at_step)
        deadline = t0 + self.recovery_timeout_s
        while not self._serving_again(fault.target, pid):
            if stop.is_set() or time.monotonic() > deadline:
                return None
            time.sleep(POLL_S)
        left = deadline - time.monotonic()
        last = self.launcher.cfg.trainer.max_steps
        step = self._wait_step(lambda s: s > at_step or s >= last, stop, left)
        if step is None:
            return None
        outcome.recovery_s = round(time.monotonic() - t0, 2)
        log.warning("fault %d: %s recovered in %.2f s (step %d)", fault.index, fault.target,
                    outcome.recovery_s, step)
        return step
