"""The fault schedule is drawn from its seed alone, the restart budget is bounded, and a
kill's recovery is measured even when it lands on the run's last step."""

import signal
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest

from relayrl.config import RunConfig
from relayrl.config.restarts import RestartConfig
from relayrl_ops.launcher import Launcher
from relayrl_ops.restarts import RestartBudget
from relayrl_testkit.fault_injector import FaultInjector
from relayrl_testkit.fault_schedule import KINDS, draw_schedule, due_steps, steps_needed


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    assert draw_schedule(3, 2, 4) == draw_schedule(3, 2, 4)
    assert draw_schedule(3, 2, 4) != draw_schedule(4, 2, 4)


def test_each_round_kills_every_kind_once_in_order():
    schedule = draw_schedule(0, 3, 2)
    assert [f.kind for f in schedule] == list(KINDS) * 3
    assert [f.index for f in schedule] == list(range(len(schedule)))
    workers = {f.target for f in schedule if f.kind == "rollout"}
    assert workers <= {"rollout-0", "rollout-1"}
    assert all(f.target == f.kind for f in schedule if f.kind != "rollout")
    assert all(1 <= f.after_steps <= 3 and 0 <= f.delay_s <= 1 for f in schedule)


def test_a_bad_schedule_request_is_refused_by_name():
    with pytest.raises(ValueError, match="rounds"):
        draw_schedule(0, 0, 2)
    with pytest.raises(ValueError, match="fault kinds.*'disk'"):
        draw_schedule(0, 1, 2, kinds=("relay", "disk"))


def test_steps_needed_leaves_room_for_a_restart_the_run_goes_on_through():
    schedule = draw_schedule(0, 1, 2)
    base = steps_needed(schedule, 0, slack=0)
    assert base == sum(f.after_steps + 1 for f in schedule) + 2
    # the relay is restarting while the trainer steps; the last fault may end after the run
    assert steps_needed(schedule, 10, slack=0) == base + 10
    # each kill may land late: every gap and the end get the slack
    assert steps_needed(schedule, 10, slack=4) == base + 10 + 4 * len(schedule)


def test_due_steps_are_absolute_and_spaced_by_the_previous_fault():
    schedule = draw_schedule(0, 1, 2)
    due = due_steps(schedule, steps_per_restart=20, slack=3)
    assert due[0] == schedule[0].after_steps
    for prev, fault, a, b in zip(schedule, schedule[1:], due, due[1:], strict=False):
        restart = 20 if prev.kind in ("relay", "rollout") else 0
        assert b - a == fault.after_steps + 1 + 3 + restart


def test_restarts_back_off_doubling_up_to_the_cap_and_stop_at_the_limit():
    budget = RestartBudget.of(RestartConfig(max_restarts=4, backoff_s=1.0, backoff_max_s=3.0))
    due = []
    for now in (0.0, 100.0, 200.0, 300.0):
        assert budget.book(now)
        assert not budget.take(now)
        due.append(budget.due_at - now)
        assert budget.take(budget.due_at)
        assert not budget.take(budget.due_at)  # once
    assert due == [1.0, 2.0, 3.0, 3.0]
    assert not budget.book(400.0)


def test_workers_restart_within_their_own_budget():
    """restarts.worker_max_restarts bounds a rollout worker's restarts, max_restarts every
    other process's."""
    cfg = RunConfig.model_validate({"restarts": {"max_restarts": 2, "worker_max_restarts": 7}})
    limits = {c.name: c.budget.limit for c in Launcher(cfg)._children()}
    assert {n: v for n, v in limits.items() if n.startswith("rollout")} == {
        "rollout-0": 7, "rollout-1": 7}
    assert {v for n, v in limits.items() if not n.startswith("rollout")} == {2}


def test_backoff_bounds_must_be_ordered():
    with pytest.raises(ValueError, match="backoff_max_s"):
        RestartConfig(backoff_s=5, backoff_max_s=1)


class _LastStepInjector(FaultInjector):
    """An injector over a run whose trainer already stands at its last step, killing a real
    process that a new one replaces at once."""

    def __init__(self, max_steps: int):
        launcher = SimpleNamespace(cfg=SimpleNamespace(trainer=SimpleNamespace(
            max_steps=max_steps)))
        super().__init__(launcher, [], [], recovery_timeout_s=5.0)
        self.trainer_step = max_steps
        self.proc = subprocess.Popen(["sleep", "30"])

    def step(self) -> int:
        return self.trainer_step

    def _pid(self, target: str) -> int:
        return self.proc.pid

    def _serving_again(self, target: str, killed_pid: int) -> bool:
        return self.proc.poll() is not None  # the launcher would have started another


def test_a_kill_on_the_runs_last_step_recovers_once_the_process_serves_again():
    injector = _LastStepInjector(max_steps=7)
    fault = draw_schedule(0, 1, 2)[-1]
    stop = threading.Event()
    t0 = time.monotonic()
    assert injector._inject(fault, stop) == 7
    [outcome] = injector.outcomes
    assert outcome.at_step == 7 and outcome.recovery_s is not None
    assert time.monotonic() - t0 < injector.recovery_timeout_s
    assert injector.proc.wait(5) == -signal.SIGKILL
