"""A peer that hangs is treated like one that died: on the real stack, the relay and then the
scheduler are frozen with SIGSTOP (alive, connections open, answering nothing). The workers'
calls to them return at their deadlines while the peer is still frozen, and are counted;
once it is thawed the run goes on, reaches its target with the relay serving the trainer's
last version, and the books balance."""

import pytest

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
