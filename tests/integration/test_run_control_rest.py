"""The run-wide control routes on a real HTTP server in front of a real scheduler core and a
real Redis: pause, resume, graceful stop, live settings, status and recent metrics; what
they change is what the services read (Redis), and survives a scheduler restart."""

import httpx
import pytest

from relayrl.config import RunConfig
from relayrl.contracts import control
from relayrl.runtime.http_server import BackgroundHTTPServer
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from scheduler_svc.core import SchedulerCore
from scheduler_svc.rest import build_rest_app
from tests.conftest import free_ports

pytestmark = pytest.mark.integration
TOKEN = "s3cret-token"
CFG = {"run_id": "ctl", "scheduler": {"lease_ttl_s": 30, "max_attempts": 2},
       "rollout": {"temperature": 1.0},
       "buffer": {"group_size": 2, "groups_per_batch": 2}, "trainer": {"max_staleness": 1}}


@pytest.fixture
def stack(tmp_path):
    server = EmbeddedRedis(tmp_path)
    redis = connect(server.url)
    cfg = RunConfig.model_validate(CFG)
    core = SchedulerCore(cfg.scheduler_part(), redis)
    (port,) = free_ports(1)
    http = BackgroundHTTPServer(build_rest_app(core, TOKEN), "127.0.0.1", port, "rest")
    http.start()
    client = httpx.Client(base_url=http.address, headers={"Authorization": f"Bearer {TOKEN}"})
    yield core, client
    client.close()
    http.stop()
    server.shutdown()


def test_pause_hands_out_nothing_until_resumed_and_survives_a_restart(stack):
    core, client = stack
    core.register("w0", "here")
    held = core.acquire("w0", 1).leases
    assert client.post("/v1/pause").json() == {"state": "paused"}
    assert core.acquire("w0", 2).leases == []
    assert core.complete("w0", held[0].lease_id)  # what is out still finishes
    assert client.get("/v1/status").json()["run"]["state"] == "paused"
    restarted = SchedulerCore(core.cfg, core.redis)
    restarted.register("w0", "here")
    assert restarted.acquire("w0", 1).leases == []
    assert client.post("/v1/resume").json() == {"state": "running"}
    assert len(core.acquire("w0", 2).leases) == 2


def test_stop_finishes_what_is_out_then_sets_the_trainers_target(stack):
    core, client = stack
    core.register("w0", "here")
    out = core.acquire("w0", 3).leases
    assert client.post("/v1/stop").json() == {"state": "stopping"}
    assert core.acquire("w0", 2).leases == []  # no new prompt
    core.refresh()
    assert client.get("/v1/status").json()["run"]["stop_target"] is None  # still out
    core.release("w0", out[0].lease_id)  # a handed-back prompt is still finished
    again = core.acquire("w0", 2)
    assert [lp.prompt_id for lp in again.leases] == [out[0].prompt_id] and not again.done
    for lp in [*again.leases, *out[1:]]:
        assert core.complete("w0", lp.lease_id)
    assert core.acquire("w0", 1).done
    core.refresh()
    status = client.get("/v1/status").json()
    assert status["done"] and status["run"]["stop_target"] == 3
    assert control.read_stop_target(core.redis, core.keys) == 3
    for action in ("resume", "pause"):  # stopping is final
        resp = client.post(f"/v1/{action}")
        assert resp.status_code == 409 and "stopping" in resp.json()["detail"]
    assert client.get("/v1/status").json()["run"]["state"] == "stopping"


def test_settings_are_checked_by_field_and_reach_redis_and_the_lease_cap(stack):
    core, client = stack
    before = client.get("/v1/settings").json()
    assert before == {"max_staleness": 1, "temperature": 1.0}
    for body, field in (({"max_staleness": -1}, "max_staleness"),
                        ({"temperature": 0}, "temperature"),
                        ({"temperature": 11}, "temperature"),
                        ({"max_staleness": "many"}, "max_staleness"),
                        ({"top_p": 0.5}, "top_p"),
                        # inside the old bounds: sampled, it made every token NaN
                        ({"temperature": 1e-300}, "temperature"),
                        ({"max_staleness": True}, "max_staleness"),  # not 1
                        ({"max_staleness": "1"}, "max_staleness"),
                        ({"max_staleness": 2.5}, "max_staleness"),
                        ({"temperature": "0.5"}, "temperature")):
        resp = client.patch("/v1/settings", json=body)
        assert resp.status_code == 422, body
        assert [e["loc"][-1] for e in resp.json()["detail"]] == [field]
    for raw in ('{"temperature": NaN}', '{"temperature": -Infinity}', '{"max_staleness": 1e999}',
                "NaN"):  # Python's JSON parser takes these; they once answered 500
        resp = client.patch("/v1/settings", content=raw,
                            headers={"Content-Type": "application/json"})
        assert resp.status_code == 422, raw
        assert resp.json()["detail"][0]["input"] in ("nan", "-inf", "inf")
    assert client.post("/v1/workers/w0/drain", json={"lapse_leases": 1}).status_code == 422
    assert client.get("/v1/settings").json() == before
    assert core.policy.max_inflight == 2 * 2  # two batches at staleness 1
    resp = client.patch("/v1/settings", json={"max_staleness": 3})
    assert resp.json() == {"max_staleness": 3, "temperature": 1.0}
    assert client.patch("/v1/settings", json={"temperature": 0.7}).json()["max_staleness"] == 3
    assert core.policy.max_inflight == 2 * 3  # the scheduler's cap follows the bound
    # what the trainer and the workers read, also after a scheduler restart
    assert control.read_settings(core.redis, core.keys, core.cfg.live).model_dump() == {
        "max_staleness": 3, "temperature": 0.7}
    assert SchedulerCore(core.cfg, core.redis).policy.max_inflight == 6
    assert client.get("/v1/status").json()["run"]["settings"]["temperature"] == 0.7


def test_a_bad_setting_left_in_redis_is_ignored_by_every_reader(stack):
    """A value stored before today's bounds (the 1e-300 that crash-looped the workers): the
    services read the config's value instead, and the API shows what they use."""
    core, client = stack
    core.redis.hset(core.keys.live_settings, mapping={"temperature": "1e-300",
                                                      "max_staleness": "4"})
    assert control.read_settings(core.redis, core.keys, core.cfg.live).model_dump() == {
        "max_staleness": 4, "temperature": 1.0}
    restarted = SchedulerCore(core.cfg, core.redis)
    assert restarted.settings.temperature == 1.0 and restarted.policy.max_inflight == 2 * 4
    assert client.patch("/v1/settings", json={"temperature": 0.5}).status_code == 200
    assert core.redis.hget(core.keys.live_settings, "temperature") == b"0.5"


def test_status_reads_the_trainer_workers_and_buffer(stack):
    core, client = stack
    run = client.get("/v1/status").json()["run"]
    assert run["trainer_step"] == 0 and run["reward_mean"] is None
    core.register("w0", "here")
    core.heartbeat("w0", 4)
    core.redis.set(core.keys.trainer_version, 5)
    core.redis.xadd(core.keys.trajectories, {"data": b"x"})
    core.redis.xadd(core.keys.batches, {"data": b"y"})
    control.push_metrics(core.redis, core.keys, {
        "step": 5, "train/reward_mean": 0.25, "throughput/samples_per_s": 12.5,
        "throughput/tokens_per_s": float("nan")}, keep=10)
    status = client.get("/v1/status").json()
    run = status["run"]
    assert run["trainer_step"] == 5 and run["worker_versions"] == {"w0": 4}
    group = core.cfg.groups.group_size  # a trajectory entry is one group
    assert run["buffer"] == {"samples_waiting": group, "batches_waiting": 1}
    assert (run["reward_mean"], run["samples_per_s"], run["tokens_per_s"]) == (0.25, 12.5, None)
    assert status["handed_out"] == 0 and status["done"] is False  # the earlier fields stay


def test_metrics_are_the_latest_records_oldest_first(stack):
    core, client = stack
    assert client.get("/v1/metrics").json() == []
    for step in range(1, 31):
        control.push_metrics(core.redis, core.keys, {"step": step, "train/loss": step / 10},
                             keep=25)
    assert [r["step"] for r in client.get("/v1/metrics", params={"last": 3}).json()] == [
        28, 29, 30]
    assert len(client.get("/v1/metrics", params={"last": control.RECENT_METRICS_KEPT}).json()) == 25
    assert len(client.get("/v1/metrics").json()) == 20
    resp = client.get("/v1/metrics", params={"last": 0})
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"][-1] == "last"


def test_run_routes_need_the_token_and_a_refusal_changes_nothing(stack):
    core, client = stack
    for method, path in (("POST", "/v1/pause"), ("POST", "/v1/resume"), ("POST", "/v1/stop"),
                         ("GET", "/v1/settings"), ("PATCH", "/v1/settings"),
                         ("GET", "/v1/metrics")):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            resp = httpx.request(method, str(client.base_url) + path, headers=headers,
                                 json={"max_staleness": 7} if method == "PATCH" else None)
            assert resp.status_code == 401, (method, path, headers)
    assert control.read_run_state(core.redis, core.keys) is control.RunState.RUNNING
    assert control.read_settings(core.redis, core.keys, core.cfg.live).max_staleness == 1
    assert core.policy.control.state is control.RunState.RUNNING
