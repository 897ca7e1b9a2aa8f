"""Access control on the real stack: every gRPC method of every service and every HTTP route
of the rollout's OpenAI server and the scheduler's REST API refuses a call without the run's
token or with a wrong one, and the refused call changes nothing (each service's durable
counters, every Redis key and size). Roles (relayrl.runtime.roles): an agent's token generates and
submits but cannot publish, lease, heartbeat or stop the run; an operator's pauses and stops
but cannot publish or lease; only the trainer's publishes. The tokens `relayrl up` makes (and
the Redis password) are in no command line, log or config file (the agent's and operator's
are in a 0600 tokens.env for the user; the trainer's only in the trainer's and relay's
environment); the embedded Redis wants its password; health and /metrics stay open for
probes; TLS round-trips on a real service process, which refuses to start without its
token."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import openai
import pytest
import redis as redis_lib
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from relayrl.config import RunConfig
from relayrl.contracts.proto.v1 import (
    buffer_pb2,
    buffer_pb2_grpc,
    relay_pb2,
    relay_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)
from relayrl.runtime import auth
from relayrl.runtime.grpc_util import channel, free_ports
from relayrl.runtime.redis_conn import connect
from relayrl_ops.cli import main as cli_main
from relayrl_ops.launcher import Launcher
from tests.conftest import small_stack_config
from tests.integration.test_grpc_wrong_messages import MODULES, state, wait_until_settled
from tests.integration.tls_certs import self_signed

pytestmark = pytest.mark.integration

GROUP_SIZE = 4
WRONG = ([], [("authorization", "Bearer not-the-token")])
ROLE_VARS = ("RELAYRL_TOKEN", "RELAYRL_AGENT_TOKEN", "RELAYRL_OPERATOR_TOKEN",
             "RELAYRL_TRAINER_TOKEN")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    data = small_stack_config(tmp_path_factory.mktemp("access"), steps=1000,
                              group_size=GROUP_SIZE)
    data["scheduler"]["start_after_workers"] = 99  # no lease is ever granted: the run idles
    http_port, rest_port, metrics_port = free_ports(3)
    data["rollout"]["http_base_port"] = http_port
    data["scheduler"].update(rest_port=rest_port, metrics_port=metrics_port)
    data["auth"] = {"redis_password_env": "ACCESS_TEST_REDIS_PASSWORD"}
    with pytest.MonkeyPatch.context() as env:
        for var in ROLE_VARS:  # `relayrl up` makes each
            env.delenv(var, raising=False)
        env.delenv("RELAYRL_API_TOKEN", raising=False)  # the REST API uses the run's
        env.setenv("ACCESS_TEST_REDIS_PASSWORD", "stack-redis-s3cret")  # embedded requirepass
        launcher = Launcher(RunConfig.model_validate(data), show_trainer_output=False)
        launcher.start()
        try:
            wait_until_settled(launcher)
            yield launcher, os.environ["RELAYRL_TOKEN"]
        finally:
            launcher.shutdown()
            auth.install(None)


def methods():
    for name, module in MODULES.items():
        (service,) = module.DESCRIPTOR.services_by_name.values()
        for method in service.methods:
            yield name, f"/{service.full_name}/{method.name}", method


def raw_call(ch: grpc.Channel, path: str, method, payload, metadata):
    """A call on a plain channel, without the process's credentials."""
    kw = dict(metadata=metadata, timeout=10)
    if method.client_streaming:
        return ch.stream_unary(path)(iter([payload]), **kw)
    if method.server_streaming:
        return list(ch.unary_stream(path)(payload, **kw))
    return ch.unary_unary(path)(payload, **kw)


def test_every_grpc_method_refuses_a_missing_or_wrong_token_and_changes_nothing(stack):
    launcher, token = stack
    address = {c.name: c.address for c in launcher.children}
    before = state(launcher)
    refused = 0
    for name, path, method in methods():
        with grpc.insecure_channel(address[name]) as ch:
            for metadata in (*WRONG, [("authorization", token)],  # no "Bearer "
                             [("authorization", f"Bearer {token}x")]):
                with pytest.raises(grpc.RpcError) as err:
                    raw_call(ch, path, method, b"", metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, (path, err.value)
                assert "bearer token" in err.value.details(), path
                wanted = "$RELAYRL_TRAINER_TOKEN" if path.endswith("/Publish") else \
                    "$RELAYRL_TOKEN"  # a token that may call it
                assert wanted in err.value.details(), path
                assert token not in err.value.details()
                refused += 1
    assert refused >= 18 * 4
    assert state(launcher) == before


def test_a_refused_submit_appends_nothing_and_with_the_token_it_is_accepted(stack):
    launcher, token = stack
    address = launcher.cfg.buffer.endpoint.address
    group = buffer_pb2.SubmitRequest(source="access-test", trajectories=[
        buffer_pb2.Trajectory(prompt_tokens=[1, 2], response_tokens=[3], logprobs=[-0.5],
                              versions=[0], reward=float(i % 2), finish_reason="stop")
        for i in range(GROUP_SIZE)])
    before = state(launcher)
    with grpc.insecure_channel(address) as ch:
        for metadata in WRONG:
            with pytest.raises(grpc.RpcError) as err:
                buffer_pb2_grpc.BufferStub(ch).Submit(group, metadata=metadata, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert state(launcher) == before
    with grpc.insecure_channel(address) as ch:  # the same call, with the token, works
        buffer_pb2_grpc.BufferStub(ch).Submit(
            group, metadata=[("authorization", f"Bearer {token}")], timeout=10)
    stats = buffer_pb2_grpc.BufferStub(channel(address)).Stats(buffer_pb2.BufferStatsRequest(),
                                                               timeout=10)
    assert stats.groups_submitted == before["buffer"][-1] + 1


def test_health_is_open_for_probes(stack):
    launcher, _ = stack
    for child in launcher.children:
        with grpc.insecure_channel(child.address) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                         timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, child.name


def test_redis_requires_its_password(stack):
    launcher, _ = stack
    with pytest.raises(redis_lib.AuthenticationError):
        redis_lib.Redis.from_url(launcher.cfg.redis.url).dbsize()
    assert connect(launcher.cfg.redis.url).dbsize() > 0  # the services' keys are there


def test_no_secret_is_in_a_command_line_log_or_config_file(stack):
    launcher, token = stack
    trainer_token = os.environ["RELAYRL_TRAINER_TOKEN"].encode()
    for pid, name in [(c.proc.pid, c.name) for c in launcher.children] + \
            [(launcher.zygote.proc.pid, "zygote")]:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert token.encode() not in cmdline and trainer_token not in cmdline, name
        # a service's exec environment is the zygote's, which never held the trainer token
        # (the launcher hands it to the trainer and the relay only: tests/unit/test_zygote.py)
        assert trainer_token not in Path(f"/proc/{pid}/environ").read_bytes(), name
    run_dir = Path(launcher.cfg.run_dir)
    files = [p for p in run_dir.rglob("*") if p.is_file() and p.suffix in (".log", ".yaml",
                                                                         ".jsonl", ".json")]
    assert any(p.suffix == ".log" for p in files)
    secrets = [token, "stack-redis-s3cret", *(os.environ[v] for v in ROLE_VARS)]
    for path in files:
        text = path.read_text(errors="replace")
        assert not any(secret in text for secret in secrets), path


def test_openai_http_server_needs_the_token(stack):
    launcher, token = stack
    cfg = launcher.cfg
    base = f"http://127.0.0.1:{cfg.rollout.http_base_port}"
    before = state(launcher)
    for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": token}):
        models = httpx.get(f"{base}/v1/models", headers=headers, timeout=10)
        assert models.status_code == 401 and models.headers["www-authenticate"] == "Bearer"
        assert "bearer token" in models.json()["error"]["message"]
        done = httpx.post(f"{base}/v1/completions", headers=headers, timeout=10, json={
            "model": cfg.rollout.served_model_name, "prompt": "1+2=", "max_tokens": 2})
        assert done.status_code == 401
        assert httpx.post(f"{base}/tokenize", headers=headers, json={"prompt": "1+2="},
                          timeout=10).status_code == 401
    wrong = openai.OpenAI(base_url=f"{base}/v1", api_key="not-the-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model=cfg.rollout.served_model_name, prompt="1+2=",
                                 max_tokens=2)
    assert state(launcher) == before  # the worker generated nothing
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0)
    assert [m.id for m in client.models.list()] == [cfg.rollout.served_model_name]


def test_rest_api_uses_the_run_token_and_metrics_stay_open(stack):
    launcher, token = stack
    sc = launcher.cfg.scheduler
    rest = f"http://127.0.0.1:{sc.rest_port}"
    for headers in ({}, {"Authorization": "Bearer not-the-token"}):
        assert httpx.get(f"{rest}/v1/workers", headers=headers, timeout=10).status_code == 401
    ok = httpx.get(f"{rest}/v1/workers", headers={"Authorization": f"Bearer {token}"},
                   timeout=10)
    assert ok.status_code == 200 and len(ok.json()) == launcher.cfg.rollout.num_workers
    metrics = httpx.get(f"http://{sc.endpoint.host}:{sc.metrics_port}/metrics", timeout=10)
    assert metrics.status_code == 200 and "scheduler" in metrics.text
    assert httpx.get(f"http://{sc.endpoint.host}:{sc.metrics_port}/healthz",
                     timeout=10).status_code == 200


def relay_config(tmp_path: Path, auth_cfg: dict) -> tuple[Path, str]:
    (port,) = free_ports(1)
    data = {"run_dir": str(tmp_path / "run"), "relay": {"endpoint": {"port": port}},
            "auth": auth_cfg}
    RunConfig.model_validate(data)
    path = tmp_path / "relay.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, f"127.0.0.1:{port}"


def relay_process(path: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "relay_svc", "--config", str(path)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_service_without_its_token_does_not_start_and_names_the_variable(tmp_path):
    path, _ = relay_config(tmp_path, {"token_env": "ACCESS_TEST_TOKEN"})
    env = {k: v for k, v in os.environ.items() if k != "ACCESS_TEST_TOKEN"}
    proc = relay_process(path, env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "$ACCESS_TEST_TOKEN (auth.token_env)" in err and "Traceback" not in err


def test_tls_round_trip_on_a_real_service(tmp_path):
    cert, key = self_signed(tmp_path, "127.0.0.1")
    path, address = relay_config(tmp_path, {"tls": {"cert": str(cert), "key": str(key),
                                                    "ca": str(cert)}})
    proc = relay_process(path, {**os.environ, "RELAYRL_TOKEN": "tls-test-token"})
    tls = auth.load_tls(RunConfig.model_validate(yaml.safe_load(path.read_text())).auth.tls)
    good = auth.Credentials(token="tls-test-token", tls=tls)
    try:
        with channel(address, good) as ch:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=60,
                                                 wait_for_ready=True)
            reply = relay_pb2_grpc.RelayStub(ch).ListVersions(relay_pb2.ListVersionsRequest(),
                                                              timeout=10)
        assert list(reply.versions) == []
        with channel(address, auth.Credentials(tls=tls)) as ch, \
                pytest.raises(grpc.RpcError) as err:
            relay_pb2_grpc.RelayStub(ch).ListVersions(relay_pb2.ListVersionsRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with channel(address, auth.Credentials(token="tls-test-token")) as ch, \
                pytest.raises(grpc.RpcError) as err:  # plaintext: no handshake
            relay_pb2_grpc.RelayStub(ch).ListVersions(relay_pb2.ListVersionsRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def role_tokens(launcher) -> dict[str, str]:
    """What a user finds: the agent's and operator's tokens in the run's tokens.env."""
    path = Path(launcher.cfg.run_dir) / "tokens.env"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = [line.removeprefix("export ").split("=", 1) for line in
             path.read_text().splitlines() if line.startswith("export ")]
    return {"agent": dict(lines)["RELAYRL_AGENT_TOKEN"],
            "operator": dict(lines)["RELAYRL_OPERATOR_TOKEN"]}


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def denied(address: str, path: str, token: str, role: str) -> None:
    """The call is refused for its role, before its request (empty here) is read."""
    kinds = {m: method for _, m, method in methods()}
    with grpc.insecure_channel(address) as ch, pytest.raises(grpc.RpcError) as err:
        raw_call(ch, path, kinds[path], b"", bearer(token))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, (path, err.value)
    assert err.value.details().startswith(f"{path[1:]} needs the {role} role"), path
    assert token not in err.value.details()


def test_an_agents_token_generates_and_submits_but_cannot_publish_lease_or_stop(stack):
    launcher, _ = stack
    agent = role_tokens(launcher)["agent"]
    cfg = launcher.cfg
    before = state(launcher)
    denied(cfg.relay.endpoint.address, "/relayrl.v1.Relay/Publish", agent, "trainer")
    for method in ("AcquireLeases", "Heartbeat", "Register", "Complete", "Release"):
        denied(cfg.scheduler.endpoint.address, f"/relayrl.v1.Scheduler/{method}", agent,
               "service")
    denied(cfg.relay.endpoint.address, "/relayrl.v1.Relay/PullBytes", agent, "service")
    rest = f"http://127.0.0.1:{cfg.scheduler.rest_port}"
    for route in ("/v1/stop", "/v1/pause"):
        refused = httpx.post(rest + route, headers={"Authorization": f"Bearer {agent}"},
                             timeout=10)
        assert refused.status_code == 403 and "needs the operator role" in refused.text
    assert state(launcher) == before
    worker = next(c.address for c in launcher.children if c.name == "rollout-0")
    with grpc.insecure_channel(worker) as ch:
        reply = rollout_pb2_grpc.RolloutStub(ch).Generate(
            rollout_pb2.GenerateRequest(text="1+2=", max_new_tokens=2, seed=1),
            metadata=bearer(agent), timeout=60)
    assert len(reply.sequences[0].token_ids) >= 1
    with grpc.insecure_channel(cfg.buffer.endpoint.address) as ch:
        buffer_pb2_grpc.BufferStub(ch).Submit(buffer_pb2.SubmitRequest(
            source="agent-role-test", trajectories=[buffer_pb2.Trajectory(
                prompt_tokens=[1, 2], response_tokens=[3], logprobs=[-0.5],
                versions=[0], reward=float(i % 2), finish_reason="stop")
                for i in range(GROUP_SIZE)]), metadata=bearer(agent), timeout=10)
    base = f"http://127.0.0.1:{cfg.rollout.http_base_port}"
    models = openai.OpenAI(base_url=f"{base}/v1", api_key=agent, max_retries=0).models.list()
    assert [m.id for m in models] == [cfg.rollout.served_model_name]


def test_an_operators_token_pauses_and_stops_but_cannot_publish_or_lease(stack, capsys):
    launcher, token = stack
    operator = role_tokens(launcher)["operator"]
    cfg = launcher.cfg
    denied(cfg.relay.endpoint.address, "/relayrl.v1.Relay/Publish", operator, "trainer")
    denied(cfg.scheduler.endpoint.address, "/relayrl.v1.Scheduler/AcquireLeases", operator,
           "service")
    denied(cfg.buffer.endpoint.address, "/relayrl.v1.Buffer/Submit", operator, "agent")
    worker = next(c.address for c in launcher.children if c.name == "rollout-0")
    denied(worker, "/relayrl.v1.Rollout/Generate", operator, "agent")
    # the service token (every worker holds it) cannot publish either: only the trainer's
    denied(cfg.relay.endpoint.address, "/relayrl.v1.Relay/Publish", token, "trainer")
    with grpc.insecure_channel(cfg.relay.endpoint.address) as ch:  # the operator reads status
        relay_pb2_grpc.RelayStub(ch).ListVersions(relay_pb2.ListVersionsRequest(),
                                                  metadata=bearer(operator), timeout=10)
    assert os.environ["RELAYRL_OPERATOR_TOKEN"] == operator  # as after `source tokens.env`
    assert cli_main(["services", str(launcher.config_path)]) == 0
    statuses = json.loads(capsys.readouterr().out)
    assert len(statuses) == 4 + cfg.rollout.num_workers
    assert not [name for name, s in statuses.items() if "error" in s], statuses
    rest = httpx.Client(base_url=f"http://127.0.0.1:{cfg.scheduler.rest_port}", timeout=10,
                        headers={"Authorization": f"Bearer {operator}"})
    assert rest.post("/v1/pause").json()["state"] == "paused"
    assert rest.post("/v1/resume").json()["state"] == "running"
    # stop last: the idle run ends; this module's other tests take their state before it
    assert rest.post("/v1/stop").json()["state"] == "stopping"
