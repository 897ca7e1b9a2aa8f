"""The launcher's zygote: one process that imports torch and transformers once, then forks
each service from itself, so a local run pays those imports (about 4.5 s of CPU) once
instead of once per trainer, worker and relay.

    launcher --stdin, a JSON line per request--> zygote --fork--> service
    launcher <--stdout, a JSON line per event--- zygote

Requests: {"op": "spawn", "name", "module", "argv", "env", "log", "stderr_to_log"} answered
{"pid": P} (or {"error": ...}); {"op": "signal", "pid", "signal"}, sent only to a child
not yet reaped, so a recycled pid is never hit. Events: {"exited": P, "code": C}, C as
subprocess reports it (negative: the signal). EOF on stdin ends the zygote, and its
children with it.

A forked service is `python -m <module>` in all but its exec: its environment, stdio, argv
and signal dispositions are set first and it runs through runpy, outside every frame of the
zygote's loop. /proc/PID/cmdline shows that command line (setproctitle); /proc/PID/environ
is the zygote's exec environment, which holds no trainer token. Each child dies with the
zygote, which dies with the launcher (relayrl.procs). Started by relayrl.ops.launcher as
`python -u -m relayrl.ops.zygote LAUNCHER_PID RUN_DIR MODULE...` (the run directory only
names it in `ps`; the modules are imported before the first fork).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import time

from setproctitle import setproctitle

from relayrl.procs import PARENT_ENV, die_with_parent

# what the services share and spend start-up on; a module that fails to import here is
# imported (and reported) by the service that needs it
PRELOAD = ("torch", "transformers", "transformers.models.auto.modeling_auto",
           "transformers.models.llama.modeling_llama", "grpc", "pydantic", "yaml")
POLL_S = 0.1
REPLY_FD = 3  # main() moves the reply pipe here: whatever an import prints goes to stderr


def _reply(message: dict) -> None:
    os.write(REPLY_FD, (json.dumps(message) + "\n").encode())


def _reap(live: set[int]) -> None:
    while live:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        live.discard(pid)
        _reply({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(live: set[int]) -> dict | None:
    """Answer requests until stdin closes (None); in a forked child, return its request."""
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], POLL_S)
        _reap(live)
        if not readable:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return None
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            request = json.loads(line)
            if request["op"] == "signal":
                if request["pid"] in live:
                    os.kill(request["pid"], request["signal"])
                continue
            try:
                pid = os.fork()
            except OSError as err:
                _reply({"error": f"fork failed: {err}"})
                continue
            if pid == 0:
                return request
            live.add(pid)
            _reply({"pid": pid})


def run_child(request: dict) -> None:
    """Become the service `request` names, as `python -m` would have started it."""
    zygote = os.getppid()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    die_with_parent(zygote)
    os.close(REPLY_FD)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the zygote's request pipe
    os.close(null)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    if request["stderr_to_log"]:
        os.dup2(log, 2)
    os.close(log)
    # before the environment changes: setproctitle finds argv's memory beside environ's
    setproctitle(" ".join([sys.executable, "-m", request["module"], *request["argv"]]))
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ[PARENT_ENV] = str(zygote)
    sys.argv = [request["module"], *request["argv"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


class Zygote:
    """The launcher's end: starts the zygote with `env` as its exec environment, and hands
    out Forked processes."""

    def __init__(self, env: dict[str, str], run_dir: str, preload: tuple[str, ...] = PRELOAD):
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", __name__, str(os.getpid()), run_dir, *preload],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.exits: dict[int, int] = {}
        self._pending = b""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, name: str, module: str, argv: list[str], env: dict[str, str], log: str,
              stderr_to_log: bool) -> Forked:
        """Fork `python -m module argv...`; waits while the zygote still imports."""
        if not self.alive():
            raise RuntimeError(f"the zygote exited with {self.proc.returncode} before "
                               f"starting {name}")
        self._send({"op": "spawn", "name": name, "module": module, "argv": argv, "env": env,
                    "log": log, "stderr_to_log": stderr_to_log})
        while True:
            for reply in self._read(POLL_S):
                if "error" in reply:
                    raise OSError(f"the zygote could not start {name}: {reply['error']}")
                if "pid" in reply:
                    return Forked(self, reply["pid"], [module, *argv])
            if not self.alive():
                raise RuntimeError(f"the zygote exited with {self.proc.returncode} before "
                                   f"starting {name}")

    def signal(self, pid: int, signum: int) -> None:
        self._send({"op": "signal", "pid": pid, "signal": int(signum)})

    def collect(self) -> None:
        """Record the exits the zygote has reported so far."""
        if not self.proc.stdout.closed:
            self._read(0)

    def close(self, timeout_s: float = 10.0) -> None:
        """EOF on its stdin: the zygote exits, and with it any child still running."""
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.collect()  # the exits it reported before it went
        self.proc.stdout.close()

    def _send(self, request: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: spawn says so, a signal has no one left to reach

    def _read(self, timeout_s: float) -> list[dict]:
        """The replies that arrive within `timeout_s`, exits recorded on the way."""
        fd = self.proc.stdout.fileno()
        replies: list[dict] = []
        while select.select([fd], [], [], timeout_s)[0]:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._pending += chunk
            *lines, self._pending = self._pending.split(b"\n")
            for line in lines:
                message = json.loads(line)
                if "exited" in message:
                    self.exits[message["exited"]] = message["code"]
                else:
                    replies.append(message)
            timeout_s = 0
        return replies


class Forked:
    """A service forked by the zygote, with the part of subprocess.Popen's interface the
    launcher, the benches and the tests use."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]):
        self.zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.collect()
            self.returncode = self.zygote.exits.get(self.pid)
            if self.returncode is None and not self.zygote.alive() and not _exists(self.pid):
                self.returncode = -signal.SIGTERM  # it died with the zygote
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is not None:
            return
        if self.zygote.alive():
            self.zygote.signal(self.pid, signum)
        else:  # an orphan still stopping: not recycled while it exists
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def main() -> None:
    die_with_parent(int(sys.argv[1]))
    os.dup2(1, REPLY_FD, inheritable=False)
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    for module in sys.argv[3:]:
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    request = serve(set())
    if request is not None:
        run_child(request)


if __name__ == "__main__":
    main()
