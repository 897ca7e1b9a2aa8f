"""A peer that hangs is treated like one that died: on the real stack, the relay and then the
scheduler are frozen with SIGSTOP (alive, connections open, answering nothing). The workers'
calls to them return at their deadlines while the peer is still frozen, and are counted;
once it is thawed the run goes on, reaches its target with the relay serving the trainer's
last version, and the books balance."""

import os
import time

import pytest

from relayrl.runtime.grpc_util import check_health
from tests.conftest import snapshot
from tests.integration.live_stack import (
    frozen,
    pid_of,
    running,
    stack_config,
    trainer_version,
    wait_for,
    worker_metric,
)

pytestmark = pytest.mark.integration

STEPS = 10


def total(cfg, name: str) -> float:
    return sum(worker_metric(cfg, name))


def test_calls_to_a_frozen_peer_time_out_and_the_run_recovers(tmp_path):
    cfg = stack_config(tmp_path, STEPS, relay={"timeout_s": 1.0},
                       scheduler={"call_timeout_s": 1.0})
    with running(cfg) as launcher:
        cfg = launcher.cfg
        wait_for(lambda: trainer_version(cfg) >= 2, 120, "two trainer steps")
        for peer, counter in (("relay", "relayrl_weights_pull_failures_total"),
                              ("scheduler", "relayrl_rollout_scheduler_call_failures_total")):
            before = total(cfg, counter)
            with frozen(pid_of(launcher, peer)):
                # a call that returns while the peer is still stopped returned by deadline
                wait_for(lambda c=counter, b=before: total(cfg, c) > b, 60,
                         f"a worker's call to the frozen {peer} to time out")
        assert launcher.wait() == 0
        state = snapshot(cfg)
    assert state["versions"][-1] == STEPS  # the thawed relay took the trainer's newest version
    audit = state["audit"]
    assert audit.balanced, audit.render()
    assert audit.counts["in_flight"] == 0
    logs = "".join((cfg.run_path / "logs" / f"rollout-{i}.log").read_text() for i in range(2))
    assert "DEADLINE_EXCEEDED" in logs or "Deadline Exceeded" in logs


# Stalls long enough to outlast every deadline that used to end a process (a Redis command's
# socket timeout and the client's ~8 s reconnect window, a worker's scheduler call, the
# trainer's publish) several times over. RELAYRL_REDIS_STALL_S=60 RELAYRL_SCHEDULER_STALL_S=30
# gives a minute-long Redis stall.
REDIS_STALL_S = float(os.environ.get("RELAYRL_REDIS_STALL_S", 10))
SCHEDULER_STALL_S = float(os.environ.get("RELAYRL_SCHEDULER_STALL_S", 10))
RELAY_STALL_S = float(os.environ.get("RELAYRL_RELAY_STALL_S", 10))
REDIS_CLIENTS = ("scheduler", "buffer", "trainer")  # each waits on Redis in its loop


def unready(launcher, names) -> set[str]:
    return {c.name for c in launcher.children if c.name in names
            and not check_health(c.address)}


def stalled(launcher, pid: int, least_s: float, waiters) -> dict[str, float]:
    """`pid` stopped until every one of `waiters` has reported NOT_SERVING and at least
    `least_s` has passed; then until every service is SERVING again. Seconds from the thaw
    until each was serving again."""
    seen: set[str] = set()
    t0 = time.monotonic()
    with frozen(pid):
        wait_for(lambda: seen.update(unready(launcher, waiters)) or seen >= set(waiters),
                 least_s + 120, f"{sorted(set(waiters) - seen)} to report NOT_SERVING")
        time.sleep(max(0.0, least_s - (time.monotonic() - t0)))  # the stall's length itself
    thawed, back = time.monotonic(), {}
    names = {c.name for c in launcher.children}

    def all_serving() -> bool:
        ended = {c.name: c.proc.poll() for c in launcher.children if c.proc.poll() is not None}
        finished = {"trainer"} if ended.get("trainer") == 0 else set()  # the run's own end
        dead = {name: code for name, code in ended.items() if name not in finished}
        assert not dead, f"exited during the outage: {dead}"
        for name in names - set(back) - (unready(launcher, names) - finished):
            back[name] = time.monotonic() - thawed
        return len(back) == len(names)

    wait_for(all_serving, 120, "every service to report SERVING again")
    return back


def test_a_stalled_redis_scheduler_and_relay_are_ridden_out_without_a_restart(tmp_path):
    cfg = stack_config(tmp_path, STEPS, redis={"socket_timeout_s": 3.0},
                       scheduler={"call_timeout_s": 2.0}, relay={"timeout_s": 2.0})
    with running(cfg) as launcher:
        cfg = launcher.cfg
        wait_for(lambda: trainer_version(cfg) >= 2, 120, "two trainer steps")
        redis_back = stalled(launcher, launcher.embedded.pid, REDIS_STALL_S, REDIS_CLIENTS)
        workers = [c.name for c in launcher.children if c.name.startswith("rollout-")]
        scheduler_back = stalled(launcher, pid_of(launcher, "scheduler"), SCHEDULER_STALL_S,
                                 workers)
        at_relay_stall = trainer_version(cfg)
        assert at_relay_stall < STEPS, "the run ended before the relay could be stalled"
        # the trainer's publishes and the workers' refreshes pass their deadline meanwhile
        relay_back = stalled(launcher, pid_of(launcher, "relay"), RELAY_STALL_S,
                             ["trainer", *workers])
        assert launcher.wait() == 0
        restarts = {c.name: c.budget.used for c in launcher.children}
        restarts["redis"] = launcher.redis_budget.used
        state = snapshot(cfg)
    print(f"redis stalled {REDIS_STALL_S:g} s, back within {redis_back}; scheduler stalled "
          f"{SCHEDULER_STALL_S:g} s, back within {scheduler_back}; relay stalled "
          f"{RELAY_STALL_S:g} s from version {at_relay_stall}, back within {relay_back}; "
          f"restarts {restarts}")
    assert not any(restarts.values()), restarts
    assert state["versions"][-1] == STEPS  # the final version reached the relay after all
    audit = state["audit"]
    assert audit.balanced, audit.render()
    assert audit.counts["in_flight"] == 0
    logs = {name: (cfg.run_path / "logs" / f"{name}.log").read_text()
            for name in {*REDIS_CLIENTS, *workers}}
    for name in REDIS_CLIENTS:  # the wait is logged once, and the recovery
        assert logs[name].count("redis unreachable") >= 1 and "redis is back after" in \
            logs[name], name
    for name in ["trainer", *workers]:
        assert "relay unreachable" in logs[name] and "relay is back after" in logs[name], name
