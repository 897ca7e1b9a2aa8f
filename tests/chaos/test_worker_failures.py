"""Workers fail mid-run: one is killed with SIGKILL (the launcher restarts it and it
registers afresh), another is frozen with SIGSTOP past its lease deadline and thawed later
with stale leases in hand. The run must still finish with every prompt trained exactly once."""

import os
import signal
import threading
import time

import pytest
import redis as redis_lib

from relayrl.config import RunConfig
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.proto.v1 import scheduler_pb2, scheduler_pb2_grpc
from relayrl.runtime.grpc_util import channel, wait_healthy
from relayrl_ops.launcher import Launcher
from tests.conftest import small_stack_config, snapshot

STEPS, GROUPS, GROUP_SIZE, TTL_S = 100, 2, 4, 2.0


def trainer_version(cfg: RunConfig) -> int:
    value = redis_lib.Redis.from_url(cfg.redis.url).get(RunKeys(cfg.run_id).trainer_version)
    return int(value or 0)


def holds_a_lease(cfg: RunConfig, worker_id: str) -> bool:
    stub = scheduler_pb2_grpc.SchedulerStub(channel(cfg.scheduler.endpoint.address))
    status = stub.Status(scheduler_pb2.SchedulerStatusRequest(), timeout=5)
    return status.worker_leases.get(worker_id, 0) > 0


def freeze_holding_a_lease(cfg: RunConfig, worker_id: str, pid: int, timeout_s: float) -> None:
    """SIGSTOP the worker at a moment it holds a lease: stop first, then look, so it cannot
    finish its lease between the look and the signal."""
    deadline = time.monotonic() + timeout_s
    while True:
        os.kill(pid, signal.SIGSTOP)
        if holds_a_lease(cfg, worker_id):
            return
        os.kill(pid, signal.SIGCONT)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{worker_id} never held a lease")
        time.sleep(0.02)


def wait_for(cond, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def survived_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chaos")
    data = small_stack_config(tmp, steps=STEPS, groups_per_batch=GROUPS, group_size=GROUP_SIZE)
    data["scheduler"].update(lease_ttl_s=TTL_S, heartbeat_interval_s=0.3, max_attempts=6,
                             start_after_workers=3)
    # long enough responses that a worker is caught holding a lease
    data["rollout"].update(num_workers=3, max_new_tokens=48, segment_tokens=16)
    cfg = RunConfig.model_validate(data)
    launcher = Launcher(cfg, show_trainer_output=False)
    events: dict = {}

    def chaos():
        by_name = {c.name: c for c in launcher.children}
        cfg = launcher.cfg
        wait_for(lambda: trainer_version(cfg) >= 3, 120)
        events["killed_pid"] = by_name["rollout-0"].proc.pid
        freeze_holding_a_lease(cfg, "rollout-0", events["killed_pid"], 60)
        os.kill(events["killed_pid"], signal.SIGKILL)
        frozen = by_name["rollout-1"].proc.pid
        freeze_holding_a_lease(cfg, "rollout-1", frozen, 60)
        events["frozen_at"] = trainer_version(launcher.cfg)
        time.sleep(2.5 * TTL_S)  # its leases lapse and are handed to the others
        os.kill(frozen, signal.SIGCONT)
        events["thawed_at"] = trainer_version(launcher.cfg)

    try:
        launcher.start()
        thread = threading.Thread(target=chaos, daemon=True)
        thread.start()
        code = launcher.wait()
        thread.join(30)
        for c in launcher.children:  # a restarted worker may still be starting
            if c.name.startswith("rollout-"):
                wait_healthy(c.address, 120, alive=lambda p=c.proc: p.poll() is None)
        state = snapshot(launcher.cfg)
        restarted = {c.name: c.budget.used for c in launcher.children}
        pids = {c.name: c.proc.pid for c in launcher.children}
    finally:
        launcher.shutdown()
    return code, state, events, restarted, pids


def test_the_run_finished(survived_run):
    code, _, events, _, _ = survived_run
    assert code == 0
    assert events["thawed_at"] < STEPS, "the frozen worker must come back before the end"


def test_the_killed_worker_was_restarted_and_registered(survived_run):
    _, state, events, restarted, pids = survived_run
    assert restarted["rollout-0"] == 1 and pids["rollout-0"] != events["killed_pid"]
    status = {w.worker_id: w for w in state["workers"]}
    assert "rollout-0" in status  # the new process answers under the same name
    assert restarted["rollout-1"] == 0 and restarted["rollout-2"] == 0


def test_the_leases_of_both_were_reissued(survived_run):
    _, state, _, _, _ = survived_run
    assert state["scheduler"].leases_expired >= 2


def test_every_prompt_trained_exactly_once(survived_run):
    _, state, _, _, _ = survived_run
    led, sched = state["ledger"], state["scheduler"]
    assert sched.handed_out == len(led["leased"]) == STEPS * GROUPS
    assert led["failed"] == set()
    assert not led["consumed"] & led["dropped"]
    assert led["consumed"] | led["dropped"] == led["leased"] == led["batched"]
    assert state["audit"].balanced, state["audit"].render()
    assert state["audit"].counts["trainer_finished"] == STEPS * GROUPS  # none trained twice
    b = state["buffer"]
    assert b.batches_emitted == STEPS and b.trajectory_stream_len == 0
    assert state["pending_batches"] == 0
