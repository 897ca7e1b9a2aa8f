"""`relayrl up` as a user runs it: Ctrl-C, or even kill -9 of the launcher, leaves no
process of the run behind (services, embedded Redis)."""

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from relayrl.runtime.auth import DEFAULT_TOKEN_ENV
from relayrl.runtime.grpc_util import check_health
from tests.conftest import small_stack_config


def processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()[1:] if text in line and "ps -eo" not in line]


def start_run(tmp_path, started: list):
    data = small_stack_config(tmp_path, steps=100_000)
    data["scheduler"]["max_prompts"] = 0  # never runs out: the run only ends by signal
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    proc = subprocess.Popen([sys.executable, "-m", "relayrl_ops.cli", "up", str(cfg_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    started.append(proc)
    last_worker = f"127.0.0.1:{data['rollout']['base_port'] + 1}"
    deadline = time.monotonic() + 120
    while not check_health(last_worker):
        assert proc.poll() is None, "relayrl up exited early"
        assert time.monotonic() < deadline, "the stack did not come up"
        time.sleep(0.5)
    marker = str(tmp_path)  # in the launcher's and every service's command line
    redis_url = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["redis"]["url"]
    socket = redis_url.removeprefix("unix://")
    assert len(processes_mentioning(marker)) >= 7  # launcher + six services
    assert processes_mentioning(socket), "embedded redis-server not found"
    return proc, marker, socket


# After kill -9 of the launcher every service gets SIGTERM at once, so each may be mid-call
# to a peer that is stopping too: a worker sees its stop only once that call returns, which
# can take a call deadline or two (Redis commands: 10 s), then tears torch down. On a loaded
# 2-core machine that once came to just over 30 s.
GONE_WITHIN_S = 60.0


def wait_all_gone(markers: list[str], timeout_s: float = GONE_WITHIN_S) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for m in markers for p in processes_mentioning(m)]
        if not left:
            return []
        time.sleep(0.3)
    return left


@pytest.mark.parametrize("how", ["ctrl-c", "kill-9"])
def test_no_orphans(tmp_path, how):
    started: list[subprocess.Popen] = []
    try:
        proc, marker, socket = start_run(tmp_path, started)
        if how == "ctrl-c":  # the terminal sends SIGINT to the whole foreground group
            os.killpg(proc.pid, signal.SIGINT)
            assert proc.wait(timeout=60) == 130
        else:
            proc.kill()
            proc.wait()
        assert wait_all_gone([marker, socket]) == []
    finally:  # never leave a failed test's stack running
        for p in started:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


def redis_servers() -> set[str]:
    return {line.split()[0] for line in processes_mentioning("redis-server")}


def test_a_service_started_alone_stops_the_redis_it_embedded(tmp_path):
    """Without a Redis URL (no launcher) a service starts an embedded server; on SIGTERM it
    must stop that server, not leave a redis-server per run behind."""
    data = small_stack_config(tmp_path, steps=1)
    cfg_path = tmp_path / "scheduler.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    before = redis_servers()
    env = {**os.environ, DEFAULT_TOKEN_ENV: "test-token"}
    proc = subprocess.Popen([sys.executable, "-m", "scheduler_svc", "--config", str(cfg_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        address = f"127.0.0.1:{data['scheduler']['endpoint']['port']}"
        deadline = time.monotonic() + 60
        while not check_health(address):
            assert proc.poll() is None, f"the scheduler exited: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "the scheduler did not come up"
            time.sleep(0.2)
        started = redis_servers() - before
        assert started, "the scheduler started no embedded redis-server"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 15
        while started & redis_servers() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not started & redis_servers(), "the embedded redis-server outlived its service"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_service_that_cannot_start_is_named_with_its_reason_and_nothing_stays(tmp_path):
    """`relayrl up` says which service refused to start and why (the end of its log), not
    only that a port never answered, and stops the services already started."""
    data = small_stack_config(tmp_path, steps=5)
    data["relay"]["shm_dir"] = str(tmp_path / "no-such-dir")
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    proc = subprocess.run([sys.executable, "-m", "relayrl_ops.cli", "up", str(cfg_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    said = proc.stderr[proc.stderr.index("relayrl up: "):]
    assert said.startswith("relayrl up: relay exited with code 2 before serving"), said
    assert "Traceback" not in said, said  # a refusal, not a crash
    assert f"relay.shm_dir '{tmp_path / 'no-such-dir'}' is not a directory" in said, said
    assert str(tmp_path / "run" / "logs" / "relay.log") in said
    assert wait_all_gone([str(tmp_path)]) == []
