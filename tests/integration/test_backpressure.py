"""Backpressure on the real stack (embedded Redis, every service its own process).

A trainer slower than generation (here: stopped with SIGSTOP) fills the batch stream to
buffer.max_pending_batches and the trajectory stream to buffer.max_pending_samples, and no
further: workers wait and say so. Redis at its memory limit (maxmemory with noeviction)
refuses writes: producers back off, count the refusals, and deliver everything once the
limit is raised. Either way the run then finishes and the books balance exactly."""

from contextlib import ExitStack

import httpx
import pytest

from relayrl.rules.staleness import inflight_prompts
from tests.conftest import free_ports, snapshot
from tests.integration.live_stack import (
    buffer_depth,
    frozen,
    pid_of,
    redis_of,
    running,
    stack_config,
    trainer_version,
    wait_for,
    worker_metric,
)

pytestmark = pytest.mark.integration

STEPS, GROUPS, GROUP_SIZE = 10, 2, 4  # small_stack_config's batch: 2 groups of 4 samples
MAX_SAMPLES, MAX_BATCHES = 2 * GROUPS * GROUP_SIZE, 1
API_TOKEN = "backpressure-test-token"


def assert_run_finished_exactly(launcher) -> dict:
    assert launcher.wait() == 0
    cfg = launcher.cfg
    state = snapshot(cfg)
    audit = state["audit"]
    assert audit.balanced, audit.render()
    assert audit.counts["in_flight"] == 0 and audit.counts["trainer_finished"] == STEPS * GROUPS
    return state


def test_a_stopped_trainer_fills_the_buffer_to_its_bound_and_workers_wait(tmp_path):
    cfg = stack_config(
        tmp_path, STEPS,
        # the scheduler's in-flight cap would hold workers back first: let the buffer do it
        scheduler={"max_inflight_prompts": 10_000},
        buffer={"max_pending_samples": MAX_SAMPLES, "max_pending_batches": MAX_BATCHES})
    depths: list[tuple[int, int]] = []
    with running(cfg) as launcher:
        r = redis_of(launcher.cfg)

        def sample() -> None:
            depths.append(buffer_depth(r, cfg))

        def full_and_waiting() -> bool:  # only true once the frozen trainer left it full
            return (bool(depths) and depths[-1] == (MAX_SAMPLES, MAX_BATCHES)
                    and all(worker_metric(launcher.cfg, "relayrl_rollout_buffer_waiting")))

        with frozen(pid_of(launcher, "trainer")):
            wait_for(full_and_waiting, 120, "the buffer at its bound, every worker waiting",
                     every=sample)
            full_at = len(depths)
            for _ in range(20):  # while they wait, nothing more comes in
                sample()
            generated = sum(worker_metric(launcher.cfg, "relayrl_rollout_samples_generated_total"))
            waits = worker_metric(launcher.cfg, "relayrl_rollout_buffer_full_waits_total")
        assert all(w > 0 for w in waits), waits
        # the bound was reached, never passed, and held while the workers waited
        assert max(s for s, _ in depths) == MAX_SAMPLES, depths
        assert max(b for _, b in depths) == MAX_BATCHES, depths
        assert all(s == MAX_SAMPLES for s, _ in depths[full_at:]), depths[full_at:]
        assert generated < STEPS * GROUPS * GROUP_SIZE  # the workers did stop early
        state = assert_run_finished_exactly(launcher)
    assert sum(w.samples_generated for w in state["workers"]) == state["buffer"].samples_read
    assert state["buffer"].groups_duplicate == 0
    logs = (cfg.run_path / "logs" / "rollout-0.log").read_text()
    assert "buffer full" in logs and "waiting for the trainer" in logs


def test_redis_at_its_memory_limit_makes_producers_back_off_and_lose_nothing(
        tmp_path, monkeypatch):
    monkeypatch.setenv("RELAYRL_API_TOKEN", API_TOKEN)
    (rest_port,) = free_ports(1)
    cfg = stack_config(tmp_path, STEPS, scheduler={"rest_port": rest_port})
    rest = httpx.Client(base_url=f"http://127.0.0.1:{rest_port}", timeout=10,
                        headers={"Authorization": f"Bearer {API_TOKEN}"})
    cap = inflight_prompts(cfg.buffer.groups_per_batch, cfg.trainer.max_staleness)
    workers = [f"rollout-{i}" for i in range(cfg.rollout.num_workers)]
    with running(cfg) as launcher:
        r = redis_of(launcher.cfg)
        wait_for(lambda: trainer_version(launcher.cfg) >= 2, 120, "two trainer steps")
        # Set the limit only where a worker must append under it. Paused, the workers finish
        # what they hold and the trainer trains every full batch, which leaves the in-flight
        # cap room; frozen, they cannot take it before the limit; thawed, each asks for a
        # lease (granted without a Redis write) and appends what it generates.
        assert rest.post("/v1/pause").json()["state"] == "paused"
        wait_for(lambda: rest.get("/v1/status").json()["inflight"] < cap, 120,
                 "the trainer caught up with the paused workers")
        assert rest.get("/v1/status").json()["handed_out"] < STEPS * GROUPS  # prompts left
        with ExitStack() as stack:
            for name in workers:
                stack.enter_context(frozen(pid_of(launcher, name)))
            assert rest.post("/v1/resume").json()["state"] == "running"
            r.config_set("maxmemory-policy", "noeviction")
            r.config_set("maxmemory", 1)  # every write that needs memory is refused
        try:
            wait_for(lambda: any(worker_metric(launcher.cfg,
                                               "relayrl_rollout_redis_oom_refusals_total")),
                     120, "a worker refused by Redis")
            refused_at = trainer_version(launcher.cfg)
            delivered = sum(worker_metric(launcher.cfg,
                                          "relayrl_rollout_samples_generated_total"))
            wait_for(lambda: max(worker_metric(launcher.cfg,
                                               "relayrl_rollout_redis_oom_refusals_total")) >= 3,
                     120, "a worker retrying")
            # retrying, not delivering: nothing counted as generated meanwhile
            assert sum(worker_metric(launcher.cfg,
                                     "relayrl_rollout_samples_generated_total")) == delivered
        finally:
            r.config_set("maxmemory", 0)
        state = assert_run_finished_exactly(launcher)
    assert refused_at < STEPS
    assert sum(w.samples_generated for w in state["workers"]) == state["buffer"].samples_read
    assert state["buffer"].groups_duplicate == 0
    logs = "".join(p.read_text() for p in (cfg.run_path / "logs").glob("rollout-*.log"))
    assert "Redis is at its memory limit" in logs and "accepted a producer's append" in logs

