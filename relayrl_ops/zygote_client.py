"""The launcher's end of the zygote (relayrl_ops.zygote, where the protocol is): `Zygote`
starts one and asks it to fork services; each comes back as a `Forked`, which answers the
part of subprocess.Popen's interface the launcher, the benches and the tests use."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

from relayrl_ops.zygote import POLL_S, PRELOAD


class Zygote:
    """The launcher's end: starts the zygote with `env` as its exec environment, and hands
    out Forked processes."""

    def __init__(self, env: dict[str, str], run_dir: str, preload: tuple[str, ...] = PRELOAD):
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "relayrl_ops.zygote", str(os.getpid()), run_dir,
             *preload],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.exits: dict[int, int] = {}
        self._pending = b""
        self._lock = threading.Lock()  # the pipes: a run's supervisor and watchers poll alike

    def alive(self) -> bool:
        """True while the zygote process runs."""
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
        """Send `signum` to a service the zygote forked and has not reaped."""
        self._send({"op": "signal", "pid": pid, "signal": int(signum)})

    def collect(self) -> None:
        """Record the exits the zygote has reported so far."""
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
        with self._lock:
            self.proc.stdout.close()

    def _send(self, request: dict) -> None:
        try:
            with self._lock:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: spawn says so, a signal has no one left to reach

    def _read(self, timeout_s: float) -> list[dict]:
        """The replies that arrive within `timeout_s`, exits recorded on the way."""
        replies: list[dict] = []
        with self._lock:
            out = self.proc.stdout
            if out.closed or not select.select([out], [], [], timeout_s)[0]:
                return replies
            while True:
                try:
                    chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
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
        return replies


class Forked:
    """A service forked by the zygote, with the part of subprocess.Popen's interface the
    launcher, the benches and the tests use."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]):
        self.zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status, or None while the service runs (as Popen.poll)."""
        if self.returncode is None:
            self.zygote.collect()
            self.returncode = self.zygote.exits.get(self.pid)
            if self.returncode is None and not self.zygote.alive() and not _exists(self.pid):
                self.returncode = -signal.SIGTERM  # it died with the zygote
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the service to exit and return its status (as Popen.wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Send `signum` to the service unless it has exited (as Popen.send_signal)."""
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
        """SIGTERM the service."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the service."""
        self.send_signal(signal.SIGKILL)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
