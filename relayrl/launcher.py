"""`relayrl up`: every service as its own local process, in dependency order.

The launcher owns the embedded Redis (when no URL is configured) and builds the model once
before any service starts. Ctrl-C or SIGTERM stops every child; children also get SIGTERM
from the kernel if the launcher itself dies, so nothing is left orphaned.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from relayrl.auth import install_launcher_credentials
from relayrl.config import RunConfig
from relayrl.grpc_util import wait_healthy
from relayrl.procs import child_env

log = logging.getLogger(__name__)

@dataclass
class Child:
    name: str
    module: str
    address: str
    overrides: list[str]
    proc: subprocess.Popen | None = None
    restartable: bool = False  # a rollout worker: the run goes on without it meanwhile
    restarts: int = 0


class Launcher:
    def __init__(self, cfg: RunConfig, show_trainer_output: bool = True):
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.show_trainer_output = show_trainer_output
        self.children: list[Child] = []
        self.embedded = None
        self.config_path = self.run_dir / "config.yaml"

    def _plan(self) -> list[list[Child]]:
        c = self.cfg
        workers = [Child(f"rollout-{i}", "rollout_svc",
                         f"{c.rollout.host}:{c.rollout.base_port + i}",
                         [f"rollout.worker_index={i}"], restartable=True)
                   for i in range(c.rollout.num_workers)]
        return [
            [Child("relay", "relay_svc", c.relay.endpoint.address, []),
             Child("scheduler", "scheduler_svc", c.scheduler.endpoint.address, []),
             Child("buffer", "buffer_svc", c.buffer.endpoint.address, [])],
            [Child("trainer", "trainer_svc", c.trainer.endpoint.address, [])],
            workers,
        ]

    def prepare(self) -> None:
        from relayrl.models import resolve_model_path
        from relayrl.redis_conn import EmbeddedRedis

        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        install_launcher_credentials(self.cfg.auth)  # children inherit the token by env
        updates = {}
        if not self.cfg.redis.url:
            self.embedded = EmbeddedRedis(self.run_dir, die_with_launcher=True)
            updates["redis"] = self.cfg.redis.model_copy(update={"url": self.embedded.url})
        path = resolve_model_path(self.cfg.model, self.cfg.task)
        updates["model"] = self.cfg.model.model_copy(
            update={"path": str(path.resolve()), "pretrained": None})  # services load, not build
        self.cfg = self.cfg.model_copy(update=updates)
        self.config_path.write_text(yaml.safe_dump(self.cfg.model_dump(mode="json"),
                                                   sort_keys=False))

    def _spawn(self, child: Child) -> None:
        log_path = self.run_dir / "logs" / f"{child.name}.log"
        env = {**child_env(), "RELAYRL_LOG_FILE": str(log_path), "PYTHONUNBUFFERED": "1"}
        out = open(log_path, "ab")
        cmd = [sys.executable, "-m", child.module, "--config", str(self.config_path)]
        for o in child.overrides:
            cmd += ["--set", o]
        to_terminal = child.name == "trainer" and self.show_trainer_output
        child.proc = subprocess.Popen(cmd, env=env, stdout=out,
                                      stderr=None if to_terminal else subprocess.STDOUT)
        out.close()
        if child not in self.children:
            self.children.append(child)

    def start(self) -> None:
        self.prepare()
        for stage in self._plan():
            for child in stage:
                self._spawn(child)
            for child in stage:
                proc = child.proc
                wait_healthy(child.address, timeout_s=120,
                             alive=lambda p=proc: p.poll() is None)
                log.info("%s healthy on %s (pid %d)", child.name, child.address, proc.pid)

    def wait(self) -> int:
        """Until the trainer exits (0 when it reached max_steps) or another service dies; a
    rollout worker that fails is restarted up to rollout.max_restarts times."""
        while True:
            for c in self.children:
                code = c.proc.poll()
                if code is None:
                    continue
                if c.name == "trainer":
                    return code
                if c.restartable and code != 0 and c.restarts < self.cfg.rollout.max_restarts:
                    # its leases lapse and are re-issued; the new process registers afresh
                    c.restarts += 1
                    log.warning("%s exited with %s; restarting it (%d of %d)", c.name, code,
                                c.restarts, self.cfg.rollout.max_restarts)
                    self._spawn(c)
                    continue
                level = logging.INFO if code == 0 else logging.ERROR
                log.log(level, "%s exited with %s; stopping the run (see %s)", c.name, code,
                        self.run_dir / "logs" / f"{c.name}.log")
                return 1
            time.sleep(0.2)

    def shutdown(self, timeout_s: float = 15.0) -> None:
        for c in reversed(self.children):
            if c.proc and c.proc.poll() is None:
                c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for c in reversed(self.children):
            if c.proc is None:
                continue
            try:
                c.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time; killing it", c.name)
                c.proc.kill()
                c.proc.wait()
        if self.embedded is not None:
            self.embedded.shutdown()
            self.embedded = None


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def up(cfg: RunConfig) -> int:
    launcher = Launcher(cfg)
    signal.signal(signal.SIGTERM, _raise_interrupt)  # `kill` stops the run like Ctrl-C does
    code = 1
    try:
        launcher.start()
        code = launcher.wait()
    except KeyboardInterrupt:
        log.info("interrupted; stopping every service")
        code = 130
    finally:
        launcher.shutdown()
    return code
