"""`relayrl status|pause|resume|stop|workers` against the REST control API of a real
scheduler core on a real HTTP server: the address and token come from flags, the
environment or the run config; a wrong token or no server is a clear error, exit 1."""

import json

import pytest
import yaml

from relayrl.config import RunConfig
from relayrl.contracts.control import RunState
from relayrl.runtime.http_server import BackgroundHTTPServer
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from relayrl_ops.cli import main
from scheduler_svc.core import SchedulerCore
from scheduler_svc.rest import build_rest_app
from tests.conftest import free_ports

pytestmark = pytest.mark.integration
TOKEN = "cli-token"


@pytest.fixture
def api(tmp_path, monkeypatch):
    for var in ("RELAYRL_API_URL", "RELAYRL_API_TOKEN", "RELAYRL_TOKEN", "OPS_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    server = EmbeddedRedis(tmp_path)
    (port,) = free_ports(1)
    doc = {"run_id": "cli", "run_dir": str(tmp_path / "run"),
           "scheduler": {"rest_port": port, "rest_token_env": "OPS_TOKEN"}}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(doc))
    core = SchedulerCore(RunConfig.model_validate(doc).scheduler_part(), connect(server.url))
    http = BackgroundHTTPServer(build_rest_app(core, TOKEN), "127.0.0.1", port, "rest")
    http.start()
    yield core, http.address, str(config)
    http.stop()
    server.shutdown()


def test_pause_resume_stop_change_the_run(api, monkeypatch, capsys):
    core, url, _ = api
    monkeypatch.setenv("RELAYRL_API_TOKEN", TOKEN)
    core.register("w0", "here")
    assert main(["pause", "--url", url]) == 0
    assert "run paused" in capsys.readouterr().out
    assert core.policy.control.state is RunState.PAUSED and core.acquire("w0", 1).leases == []
    assert main(["resume", "--url", url]) == 0
    assert core.policy.control.state is RunState.RUNNING
    assert main(["stop", "--url", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out.split("\n", 1)[1]) == {"state": "stopping"}
    assert main(["resume", "--url", url]) == 1  # stopping is final: the 409 is shown
    assert "409" in capsys.readouterr().err


def test_status_and_workers_read_address_and_token_from_the_config(api, monkeypatch, capsys):
    core, _, config = api
    monkeypatch.setenv("OPS_TOKEN", TOKEN)  # the variable scheduler.rest_token_env names
    core.register("w7", "here")
    core.heartbeat("w7", 3)
    assert main(["status", "--config", config]) == 0
    out = capsys.readouterr().out
    assert "state          running" in out and "w7@v3" in out
    assert main(["workers", "--config", config, "--json"]) == 0
    workers = json.loads(capsys.readouterr().out)
    assert [(w["worker_id"], w["policy_version"]) for w in workers] == [("w7", 3)]


def test_a_wrong_token_is_refused_and_changes_nothing(api, capsys):
    core, url, _ = api
    assert main(["pause", "--url", url, "--token", "wrong"]) == 1
    err = capsys.readouterr().err
    assert "refused the token (401)" in err and "$RELAYRL_API_TOKEN" in err
    assert core.policy.control.state is RunState.RUNNING


def test_no_server_or_no_address_is_a_clear_error(api, monkeypatch, capsys):
    (port,) = free_ports(1)
    monkeypatch.setenv("RELAYRL_API_TOKEN", TOKEN)
    assert main(["status", "--url", f"http://127.0.0.1:{port}"]) == 1
    assert "cannot reach the control API" in capsys.readouterr().err
    assert main(["workers"]) == 1
    assert "no control API address" in capsys.readouterr().err
