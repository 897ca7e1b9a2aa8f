"""The launcher's zygote (relayrl_ops.zygote and its client): a forked child is `python -m`
in all that a service can see, its exit is reported as subprocess reports one, and it dies
with the zygote. The zygote here preloads nothing, to start fast."""

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from relayrl.config import RunConfig
from relayrl.runtime.procs import PARENT_ENV
from relayrl_ops.launcher import PUBLISH_PARTIES, Child, Launcher
from relayrl_ops.plan import Process
from relayrl_ops.restarts import RestartBudget
from relayrl_ops.zygote_client import Zygote

CHILD = "tests.unit.zygote_child"


@pytest.fixture
def zygote(tmp_path):
    z = Zygote({**os.environ, "ZYGOTE_ONLY": "1"}, str(tmp_path), preload=("json",))
    yield z
    z.close()


def spawn(zygote, tmp_path, *argv, env=None, stderr_to_log=True):
    log = tmp_path / "child.log"
    proc = zygote.spawn("child", CHILD, list(argv), env or {"GIVEN": "yes"}, str(log),
                        stderr_to_log)
    return proc, log


def report(log: Path) -> dict:
    return json.loads(log.read_text().splitlines()[0])


def test_a_child_sees_what_python_m_would_have_given_it(zygote, tmp_path):
    proc, log = spawn(zygote, tmp_path, "exit", "3")
    assert proc.wait(timeout=30) == 3 and proc.returncode == 3
    seen = report(log)
    assert seen["name"] == "__main__" and seen["argv"][1:] == ["exit", "3"]
    assert seen["env"] == {"GIVEN": "yes", PARENT_ENV: str(zygote.proc.pid)}  # ZYGOTE_ONLY gone
    assert seen["ppid"] == zygote.proc.pid and seen["stdin"] == ""
    assert "this line went to stderr" in log.read_text()


def test_its_command_line_is_the_one_it_would_have_had(zygote, tmp_path):
    proc, log = spawn(zygote, tmp_path, "sleep")
    deadline = time.monotonic() + 30
    while not log.exists() or not log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert f"-m {CHILD} sleep" in cmdline
    proc.terminate()
    assert proc.wait(timeout=30) == -signal.SIGTERM


def test_a_failure_exits_1_with_its_traceback_in_the_log(zygote, tmp_path):
    proc, log = spawn(zygote, tmp_path, "raise")
    assert proc.wait(timeout=30) == 1
    assert "RuntimeError: the service failed" in log.read_text()
    proc.kill()  # after its exit: nothing is signalled, nothing raises


def test_a_child_ends_as_the_interpreter_would_end_it(zygote, tmp_path):
    """Its other threads finish, a thread pool it never shut down lets it go, its exit
    handlers run and its output is flushed; a message given to sys.exit is printed and
    exits 1."""
    proc, log = spawn(zygote, tmp_path, "finish")
    assert proc.wait(timeout=30) == 1
    lines = log.read_text().splitlines()
    assert "a message" in lines
    assert lines.index("the thread finished") < lines.index("the exit handler ran")


def test_stderr_may_stay_the_launchers(zygote, tmp_path):
    proc, log = spawn(zygote, tmp_path, "exit", "0", stderr_to_log=False)
    assert proc.wait(timeout=30) == 0
    assert "stderr" not in log.read_text()


def test_wait_times_out_like_popen_and_children_die_with_the_zygote(zygote, tmp_path):
    procs = [spawn(zygote, tmp_path, "sleep")[0] for _ in range(2)]
    with pytest.raises(subprocess.TimeoutExpired):
        procs[0].wait(timeout=0.3)
    zygote.close()
    for proc in procs:
        assert proc.wait(timeout=30) == -signal.SIGTERM
        assert not Path(f"/proc/{proc.pid}").exists()
    with pytest.raises(RuntimeError, match="zygote exited"):
        spawn(zygote, tmp_path, "exit", "0")


def test_only_the_publishers_get_the_trainer_token(tmp_path, monkeypatch):
    cfg = RunConfig.model_validate({"run_dir": str(tmp_path)})
    var = cfg.auth.trainer_token_env
    monkeypatch.setenv(var, "publish-secret")
    launcher = Launcher(cfg)
    assert var not in launcher._env()  # the zygote's exec environment
    for name in ("trainer", "relay", "scheduler", "buffer", "rollout-0", "relay-child-0"):
        child = Child(Process(name, "x", 0, None, (), ""), RestartBudget.of(cfg.restarts))
        assert (launcher._env(child).get(var) == "publish-secret") == (name in PUBLISH_PARTIES)


def test_threads_polling_at_once_each_see_every_exit(zygote, tmp_path):
    """The launcher's supervisor and a watcher (the fault injector) poll side by side."""
    procs = [zygote.spawn(f"c{i}", CHILD, ["exit", str(i)], {}, str(tmp_path / f"c{i}.log"),
                          True) for i in range(4)]
    seen: list[dict[int, int]] = [{}, {}]

    def watch(into: dict[int, int]) -> None:
        deadline = time.monotonic() + 30
        while len(into) < len(procs) and time.monotonic() < deadline:
            for p in procs:
                if (code := p.poll()) is not None:
                    into[p.pid] = code

    threads = [threading.Thread(target=watch, args=(s,)) for s in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen[0] == seen[1] == {p.pid: i for i, p in enumerate(procs)}
