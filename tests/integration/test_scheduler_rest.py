"""The scheduler's REST control API on a real HTTP server in front of a real scheduler core:
token required (before any body is read), bodies bounded, workers and leases listed, drain
and resume change what a worker is given."""

import logging

import httpx
import pytest

from relayrl.config import RunConfig
from relayrl.runtime.http_server import BackgroundHTTPServer
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from scheduler_svc.core import SchedulerCore
from scheduler_svc.rest import build_rest_app
from tests.conftest import free_ports

TOKEN = "s3cret-token"
BIG = 8 << 20


@pytest.fixture
def stack(tmp_path):
    server = EmbeddedRedis(tmp_path)
    cfg = RunConfig.model_validate({
        "run_id": "rest", "scheduler": {"lease_ttl_s": 30, "repack": True, "repack_below": 0.34},
        "rollout": {"segment_tokens": 4, "max_active_groups": 3},
        "buffer": {"group_size": 2}})
    core = SchedulerCore(cfg.scheduler_part(), connect(server.url))
    (port,) = free_ports(1)
    http = BackgroundHTTPServer(build_rest_app(core, TOKEN), "127.0.0.1", port, "rest")
    http.start()
    client = httpx.Client(base_url=http.address, headers={"Authorization": f"Bearer {TOKEN}"})
    yield core, client, http.address
    client.close()
    http.stop()
    server.shutdown()


def test_every_route_needs_the_token(stack):
    _, _, address = stack
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        for method, path in (("GET", "/v1/workers"), ("GET", "/v1/leases"),
                             ("POST", "/v1/workers/w0/drain"), ("GET", "/v1/status"),
                             ("POST", "/v1/repack")):
            resp = httpx.request(method, address + path, headers=headers)
            assert resp.status_code == 401, (method, path, headers)
    stack[0].register("w0", "here")
    httpx.post(address + "/v1/repack", headers={"Authorization": "Bearer wrong"})
    assert stack[0].policy.counters.leases_recalled == 0 and not stack[0].policy.draining


def test_a_big_body_without_the_token_is_refused_unread(stack):
    _, _, address = stack
    resp = httpx.post(address + "/v1/workers/w0/drain", content=b"{" * BIG,
                      headers={"content-type": "application/json"})
    assert resp.status_code == 401
    assert "missing bearer token" in resp.json()["detail"]
    assert httpx.get(address + "/healthz").status_code == 200  # public, as are the docs
    assert httpx.get(address + "/openapi.json").status_code == 200


def test_a_token_of_another_role_is_forbidden(tmp_path):
    from relayrl.runtime.roles import AGENT, OPERATOR, Holder, TokenBook

    book = TokenBook((Holder(b"Bearer op", frozenset({OPERATOR}), "OP"),
                      Holder(b"Bearer ag", frozenset({AGENT}), "AG")))
    (port,) = free_ports(1)
    http = BackgroundHTTPServer(build_rest_app(None, book), "127.0.0.1", port, "rest")
    http.start()
    try:
        resp = httpx.post(http.address + "/v1/repack", content=b"{" * BIG,
                          headers={"Authorization": "Bearer ag"})
        assert resp.status_code == 403 and "needs the operator role" in resp.json()["detail"]
    finally:
        http.stop()


def test_a_body_over_the_limit_is_refused_naming_it(stack):
    _, client, _ = stack
    limit = 64 << 10  # scheduler.rest_max_body_bytes's default
    resp = client.post("/v1/repack", content=b" " * (limit + 1),
                       headers={"content-type": "application/json"})
    assert resp.status_code == 413
    assert resp.json()["detail"] == (f"request body: {limit + 1} bytes, more than "
                                     f"scheduler.rest_max_body_bytes ({limit})")

    def chunked():  # no Content-Length: counted as it arrives
        for _ in range(BIG // (16 << 10)):
            yield b" " * (16 << 10)

    resp = client.post("/v1/repack", content=chunked(),
                       headers={"content-type": "application/json"})
    assert resp.status_code == 413
    assert resp.json()["detail"] == (f"request body: over {limit} bytes, more than "
                                     f"scheduler.rest_max_body_bytes ({limit})")
    assert client.post("/v1/repack", json={"force": False}).status_code == 200


def test_workers_and_leases_are_listed(stack):
    core, client, _ = stack
    core.register("w0", "here")
    core.register("w1", "there")
    batch = core.acquire("w0", 2)
    workers = {w["worker_id"]: w for w in client.get("/v1/workers").json()}
    assert workers["w0"]["active_leases"] == 2 and workers["w1"]["active_leases"] == 0
    assert not workers["w0"]["draining"]
    leases = client.get("/v1/leases").json()
    assert sorted(le["lease_id"] for le in leases) == sorted(lp.lease_id for lp in batch.leases)
    assert all(le["worker_id"] == "w0" and 0 < le["expires_in_s"] <= 30 for le in leases)
    assert client.get("/v1/status").json()["handed_out"] == 2


def test_a_drained_worker_gets_nothing_new_until_resumed(stack):
    core, client, _ = stack
    core.register("w0", "here")
    core.register("w1", "there")
    held = core.acquire("w0", 1).leases
    resp = client.post("/v1/workers/w0/drain")
    assert resp.status_code == 200 and resp.json()["draining"]
    assert core.acquire("w0", 2).leases == []
    assert core.complete("w0", held[0].lease_id)  # what it holds still finishes
    assert len(core.acquire("w1", 1).leases) == 1
    assert client.post("/v1/workers/w0/resume").json()["draining"] is False
    assert len(core.acquire("w0", 1).leases) == 1


def test_draining_with_lapse_hands_the_leases_to_others(stack):
    core, client, _ = stack
    core.register("w0", "here")
    core.register("w1", "there")
    taken = [lp.prompt_id for lp in core.acquire("w0", 2).leases]
    body = client.post("/v1/workers/w0/drain", json={"lapse_leases": True}).json()
    assert body["active_leases"] == 0
    again = core.acquire("w1", 2).leases
    assert sorted(lp.prompt_id for lp in again) == sorted(taken)


def test_unknown_workers_are_named_and_the_schema_documents_the_routes(stack):
    _, client, address = stack
    resp = client.post("/v1/workers/nobody/drain")
    assert resp.status_code == 404 and "nobody" in resp.json()["detail"]
    paths = httpx.get(address + "/openapi.json").json()["paths"]
    assert {"/v1/workers", "/v1/leases", "/v1/workers/{worker_id}/drain",
            "/v1/workers/{worker_id}/resume", "/v1/status", "/v1/repack"} <= set(paths)


def test_a_triggered_repack_recalls_the_tail_for_the_fuller_worker(stack):
    from relayrl.contracts.partial import PartialGroup

    core, client, _ = stack
    core.register("w0", "here")
    core.register("w1", "there")
    held = core.acquire("w0", 2).leases + core.acquire("w1", 1).leases
    # 6 seats a worker, a tail is 2 or fewer: w0 runs 3 sequences, w1 none
    for lp, done in zip(held, ([], [0], [0, 1]), strict=True):
        group = PartialGroup.fresh(lp.prompt_id, [1, 2], 2)
        for i, seq in enumerate(group.sequences):
            seq.extend([5], [-0.1], version=0)
            seq.finish_reason = "stop" if i in done else None
        assert core.save_progress("w1" if lp is held[2] else "w0", lp.lease_id, group.encode())
    moves = client.post("/v1/repack", json={"force": True}).json()
    assert moves == []  # w1 holds no unfinished sequence: nothing to move
    group = PartialGroup.fresh(held[2].prompt_id, [1, 2], 2)
    group.sequences[0].extend([5], [-0.1], version=0)
    core.save_progress("w1", held[2].lease_id, group.encode())  # 2 of 6 seats: a tail
    moves = client.post("/v1/repack").json()
    assert moves == [{"lease_id": held[2].lease_id, "sequences": 2, "from_worker": "w1",
                      "to_worker": "w0"}]
    leases = {le["lease_id"]: le for le in client.get("/v1/leases").json()}
    assert leases[held[2].lease_id]["recalled_to"] == "w0"
    assert client.get("/v1/status").json()["leases_recalled"] == 1


def test_a_scheduler_waiting_for_workers_says_how_many(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    server = EmbeddedRedis(tmp_path)
    try:
        cfg = RunConfig.model_validate({"run_id": "gate",
                                        "scheduler": {"start_after_workers": 2}})
        core = SchedulerCore(cfg.scheduler_part(), connect(server.url))
        core.register("w0", "127.0.0.1:1")
        assert "no lease until 2 workers have registered, 1 so far" in caplog.text
        assert core.acquire("w0", 4).leases == []
        caplog.clear()
        core.register("w1", "127.0.0.1:2")
        assert "no lease until" not in caplog.text
        assert core.acquire("w1", 4).leases
    finally:
        server.shutdown()
