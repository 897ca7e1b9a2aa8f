"""`relayrl up`: every service as its own local process, all started at once; with
relay.children, child relays that follow the root relay and serve the workers (a relay tree).
What runs, where and with which GPUs is the run's plan (relayrl_ops.plan); with several
nodes, `relayrl up --node K` on each starts that node's share.

The launcher owns the embedded Redis (when no URL is configured) and builds the model once
before any service starts. Services are forked from a zygote that has imported torch and
transformers once (relayrl_ops.zygote). A process that dies is restarted
(relayrl_ops.restarts). Ctrl-C or SIGTERM stops every child; children also get SIGTERM from
the kernel if the launcher itself dies, so nothing is left orphaned.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from relayrl.config import HfModel, RunConfig
from relayrl.runtime.auth import current as current_credentials
from relayrl.runtime.auth import install_launcher_credentials
from relayrl.runtime.grpc_util import check_health
from relayrl.runtime.metrics import read_records
from relayrl.runtime.procs import child_env
from relayrl_ops.plan import EVALUATOR, Process, on_node, plan
from relayrl_ops.restarts import RestartBudget
from relayrl_ops.zygote_client import Forked, Zygote

log = logging.getLogger(__name__)
PUBLISH_PARTIES = ("trainer", "relay")  # the children that see the trainer token
# start-up gives up when this long passes with no service becoming healthy: a vLLM worker's
# load is the slowest step, and each one that comes up restarts the clock
START_STALL_S = 120.0


def ended_by(code: int | None) -> str:
    """How a process ended, as a person reads it: its exit code, or the signal that killed
    it by name, with the likely sender of a SIGKILL."""
    if code is None or code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    if -code == signal.SIGKILL:
        return (f"was killed by {name} (unless someone sent it, the kernel's out-of-memory "
                "killer: `relayrl check CONFIG` plans each service's memory)")
    return f"was killed by {name}"


def trainer_stop_grace_s(metrics: Path, floor_s: float, recent: int = 10) -> float:
    """How long a stopping trainer gets before it is killed: on SIGTERM it finishes the step
    under way and writes a checkpoint, so `floor_s` plus twice its longest recent step (from
    metrics.jsonl); `floor_s` alone before its first step, or when the file cannot be read
    (a stop goes on whatever the file holds)."""
    try:
        steps = [r.figures.step_s for r in read_records(metrics) if r.figures.step_s]
    except (OSError, ValueError) as err:
        log.warning("stopping: %s unreadable (%s); the trainer gets %.0f s", metrics, err,
                    floor_s)
        return floor_s
    return floor_s + 2 * max(steps[-recent:], default=0.0)


class StartFailed(RuntimeError):
    """A service exited before it served: the message names it, its exit code and the end of
    its log, where a service says why it refused to start."""


def log_tail(path: Path, lines: int = 6) -> str:
    """The last lines of a log, progress bars left out, indented."""
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        return f"  ({err})"
    kept = [ln for ln in text.replace("\r", "\n").splitlines()
            if ln.strip() and "it/s]" not in ln]
    return "\n".join("  " + ln for ln in kept[-lines:])


@dataclass
class Child:
    """A process of the plan the launcher started, and its restart budget."""
    process: Process
    budget: RestartBudget
    proc: Forked | None = None

    @property
    def name(self) -> str:
        return self.process.name

    @property
    def address(self) -> str:
        """host:port its health is asked at; "" for the evaluator."""
        return self.process.address


class Launcher:
    """`relayrl up`: starts every service of a run's node (`node`, of resources.nodes) as its
    own process, restarts those that die within their budget, and stops them all on Ctrl-C
    or when training ends."""
    def __init__(self, cfg: RunConfig, show_trainer_output: bool = True, node: int = 0):
        self.cfg = cfg
        self.node = node
        self.run_dir = Path(cfg.run_dir)
        self.show_trainer_output = show_trainer_output
        self.children: list[Child] = []
        self.embedded = None  # relayrl_ops.redis_server.RedisServer, when no URL is configured
        self.zygote: Zygote | None = None
        self.redis_budget = RestartBudget.of(cfg.restarts)
        self.config_path = self.run_dir / "config.yaml"

    def _children(self) -> list[Child]:
        """This node's processes of the plan, each with its restart budget."""
        c = self.cfg
        return [Child(p, RestartBudget.of(c.restarts, c.restarts.worker_max_restarts)
                      if p.module == "rollout_svc" else RestartBudget.of(c.restarts))
                for p in on_node(plan(c), self.node)]

    def _warn_of_settings_that_stall(self) -> None:
        """Settings that are legal, since workers and groups may come from elsewhere (an
        agent's), but under which this launcher's run alone never ends."""
        c = self.cfg
        need, have = c.scheduler.start_after_workers, c.rollout.num_workers
        if need > have:
            log.warning("scheduler.start_after_workers is %d and this launcher starts %d "
                        "worker(s) (rollout.num_workers): no lease is handed out until %d "
                        "more register from elsewhere", need, have, need - have)
        groups = c.trainer.max_steps * c.buffer.groups_per_batch
        if 0 < c.scheduler.max_prompts < groups:
            log.warning("scheduler.max_prompts is %d and trainer.max_steps %d needs %d groups "
                        "(buffer.groups_per_batch %d a step): the trainer waits after step %d "
                        "unless groups come from elsewhere", c.scheduler.max_prompts,
                        c.trainer.max_steps, groups, c.buffer.groups_per_batch,
                        c.scheduler.max_prompts // c.buffer.groups_per_batch)

    def prepare(self) -> None:
        """Set up the run directory and credentials, start the zygote and an embedded Redis
        when no `redis.url` is set, resolve the model, and write the run's config.yaml."""
        from relayrl_ops.redis_server import RedisServer
        from relayrl_torch.models import resolve_model_path

        self._warn_of_settings_that_stall()

        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        tokens = install_launcher_credentials(self.cfg.auth, self.run_dir)  # children: by env
        if tokens is not None:
            log.info("the agent and operator tokens of this run are in %s (mode 0600): "
                     "`source` it before starting an agent or `relayrl status`", tokens)
        # it imports while Redis starts and the model resolves
        self.zygote = Zygote(self._env(), str(self.run_dir))
        updates = {}
        if not self.cfg.redis.url:
            self.embedded = RedisServer(self.run_dir, self.cfg.redis.appendfsync,
                                        current_credentials().redis_password)
            self.embedded.start()
            updates["redis"] = self.cfg.redis.model_copy(update={"url": self.embedded.url})
        path = resolve_model_path(self.cfg.model, self.cfg.task)
        updates["model"] = HfModel(path=str(path.resolve()))  # services load, not build
        self.cfg = self.cfg.model_copy(update=updates)
        self.config_path.write_text(yaml.safe_dump(self.cfg.model_dump(mode="json"),
                                                   sort_keys=False))

    def _env(self, child: Child | None = None) -> dict[str, str]:
        """A child's environment; the zygote's (child None) holds no trainer token and no
        signing key, so no service's exec environment (/proc/PID/environ) shows them. The
        signing key goes to the trainer alone: whoever holds it makes versions every worker
        applies."""
        env = {**child_env(), "PYTHONUNBUFFERED": "1"}
        if child is None or child.name not in PUBLISH_PARTIES:  # who holds it can publish
            env.pop(self.cfg.auth.trainer_token_env, None)
        if child is None or child.name != "trainer":
            env.pop(self.cfg.auth.signing_key_env, None)
        return env

    def _spawn(self, child: Child) -> None:
        log_path = self.run_dir / "logs" / f"{child.name}.log"
        env = {**self._env(child), "RELAYRL_LOG_FILE": str(log_path), **child.process.env}
        module, argv = child.process.command(str(self.config_path))
        to_terminal = child.name == "trainer" and self.show_trainer_output
        if not self.zygote.alive():
            log.warning("the zygote %s; starting another", ended_by(self.zygote.proc.returncode))
            self.zygote.close()
            self.zygote = Zygote(self._env(), str(self.run_dir))
        child.proc = self.zygote.spawn(child.name, module, argv, env, str(log_path),
                                       stderr_to_log=not to_terminal)
        if child not in self.children:
            self.children.append(child)

    def start(self) -> None:
        """Every process at once: each waits out a peer that is not up yet (relayrl.runtime.outage),
        so start-up costs the slowest import and load, not their sum. Returns once every server
        answers its health check. One that exits before it first served fails the start
        (StartFailed); one that served and died while others still load is restarted as it
        would be in the run, since those others may be waiting for it."""
        self.prepare()
        children = self._children()
        for child in children:
            self._spawn(child)
        waiting = [c for c in children if c.address]  # the evaluator has no server to ask
        progress_at = time.monotonic()
        while waiting:
            for child in list(waiting):
                if check_health(child.address):
                    waiting.remove(child)
                    progress_at = time.monotonic()
                    log.info("%s healthy on %s (pid %d)", child.name, child.address,
                             child.proc.pid)
                elif (code := child.proc.poll()) is not None:
                    path = self.run_dir / "logs" / f"{child.name}.log"
                    raise StartFailed(f"{child.name} {ended_by(code)} before serving on "
                                      f"{child.address}; the end of {path}:\n{log_tail(path)}")
            if self.supervise(among=[c for c in children if c not in waiting]) == 1:
                raise StartFailed("a service that had started died too often while the others "
                                  f"were starting (see {self.run_dir / 'logs'})")
            if waiting and time.monotonic() - progress_at > START_STALL_S:
                names = ", ".join(f"{c.name} on {c.address}" for c in waiting)
                raise TimeoutError(f"{names}: none became healthy within {START_STALL_S:.0f} s "
                                   f"(see {self.run_dir / 'logs'})")
            time.sleep(0.1)

    def wait(self, timeout_s: float | None = None) -> int:
        """Until the trainer exits with 0 (it reached max_steps) and the evaluator, if any, has
        evaluated the last version, or a process exits with 0 unasked (1) or dies once more
        than its restart budget allows (1). TimeoutError after `timeout_s`, if given."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while (code := self.supervise()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the run did not end within {timeout_s:.0f} s")
            time.sleep(0.1)
        return code

    def supervise(self, among: list[Child] | None = None) -> int | None:
        """One look at every process (or those `among` them): start those whose restart is
        due, book a restart for those that died. The run's exit code once it has ended, else
        None."""
        now = time.monotonic()
        if not self._watch_redis(now):
            return 1
        ended = None
        for c in self.children if among is None else among:
            if c.budget.take(now):
                log.info("restarting %s (%d of %d)", c.name, c.budget.used, c.budget.limit)
                self._spawn(c)
            if c.budget.pending or (code := c.proc.poll()) is None:
                continue
            if c.name == "trainer" and code == 0:
                ended = 0 if ended is None else ended
            elif c.name == EVALUATOR and code == 0:
                continue
            elif code != 0 and c.budget.book(now):
                log.warning("%s %s; restarting it", c.name, ended_by(code))
            else:
                level = logging.INFO if code == 0 else logging.ERROR
                log.log(level, "%s %s; stopping the run (see %s)", c.name, ended_by(code),
                        self.run_dir / "logs" / f"{c.name}.log")
                return 1
        if ended == 0 and any(c.name == EVALUATOR and c.proc.poll() is None
                              for c in self.children):
            return None  # the last version's eval is still running
        return ended

    def _watch_redis(self, now: float) -> bool:
        """Restart a dead embedded Redis on its own data and socket; False when it died once
        too often. Clients reconnect by themselves (the socket path does not change)."""
        server = self.embedded
        if server is None or server.alive():
            return True
        budget = self.redis_budget
        if not budget.pending:
            if not budget.book(now):
                log.error("redis exited with %s; stopping the run", server.reap())
                return False
            log.warning("redis exited with %s; restarting it", server.reap())
        if budget.take(now):
            server.start()
        return True

    def shutdown(self, timeout_s: float = 15.0) -> None:
        """SIGTERM every service in reverse start order, SIGKILL those still running after
        `timeout_s` (the trainer: after its step under way, trainer_stop_grace_s), then stop
        the zygote and the embedded Redis."""
        for c in reversed(self.children):
            c.budget.due_at = None
            if c.proc and c.proc.poll() is None:
                c.proc.send_signal(signal.SIGTERM)
        now = time.monotonic()
        deadline = now + timeout_s
        trainer_deadline = now + trainer_stop_grace_s(self.run_dir / "metrics.jsonl", timeout_s)
        for c in reversed(self.children):
            if c.proc is None:
                continue
            until = trainer_deadline if c.name == "trainer" else deadline
            try:
                c.proc.wait(max(0.1, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time; killing it", c.name)
                c.proc.kill()
                c.proc.wait()
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
        if self.embedded is not None:
            self.embedded.shutdown()
            self.embedded = None


def up(cfg: RunConfig, node: int = 0) -> int:
    """Run node `node`'s processes until the trainer finishes (0), a process fails (1) or
    Ctrl-C/SIGTERM (130)."""
    launcher = Launcher(cfg, node=node)
    interrupted = False

    def on_interrupt(signum, frame):
        nonlocal interrupted
        first, interrupted = not interrupted, True
        if first:  # once: a second Ctrl-C must not break the shutdown under way
            raise KeyboardInterrupt

    # `kill` stops the run like Ctrl-C does; the flag, not the exception, says it happened:
    # raised inside a library's blocking call (a health check's gRPC wait) the interrupt
    # may surface as another error
    signal.signal(signal.SIGINT, on_interrupt)
    signal.signal(signal.SIGTERM, on_interrupt)
    code = 1
    try:
        launcher.start()
        code = launcher.wait()
    except KeyboardInterrupt:
        pass
    except Exception:
        if not interrupted:
            raise
    finally:
        if interrupted:
            log.info("interrupted; stopping every service")
        launcher.shutdown()
    return 130 if interrupted else code
