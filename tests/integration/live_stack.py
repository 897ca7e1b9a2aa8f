"""For tests that disturb a running stack: a small config with every worker's /metrics on,
the stack started in this process, SIGSTOP/SIGCONT of one service, the buffer's depth and
the workers' counters read live."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import redis as redis_lib
from prometheus_client.parser import text_string_to_metric_families

from relayrl.config import RunConfig
from relayrl.contracts.keys import TRAINER_GROUP, RunKeys
from relayrl_ops.launcher import Launcher
from relayrl_testkit.ports import free_port_block
from tests.conftest import small_stack_config


def stack_config(tmp: Path, steps: int, **sections: dict) -> RunConfig:
    """small_stack_config with worker /metrics on and `sections` merged in."""
    data = small_stack_config(tmp, steps=steps)
    data["rollout"]["metrics_base_port"] = free_port_block(data["rollout"]["num_workers"])
    for name, fields in sections.items():
        data.setdefault(name, {}).update(fields)
    return RunConfig.model_validate(data)


@contextmanager
def running(cfg: RunConfig) -> Iterator[Launcher]:
    launcher = Launcher(cfg, show_trainer_output=False)
    try:
        launcher.start()
        yield launcher
    finally:
        launcher.shutdown()


def pid_of(launcher: Launcher, name: str) -> int:
    return next(c.proc.pid for c in launcher.children if c.name == name)


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    """The process stopped (SIGSTOP) for the block: alive, holding its sockets, answering
    nothing, like a hung peer."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str,
             every: Callable[[], None] | None = None) -> None:
    """Poll `cond` (calling `every` between polls) until it holds; TimeoutError naming
    `what` otherwise. The timeout only stops a broken run from hanging the suite."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached within {timeout_s:.0f} s: {what}")
        if every is not None:
            every()
        time.sleep(0.05)


def redis_of(cfg: RunConfig) -> redis_lib.Redis:
    return redis_lib.Redis.from_url(cfg.redis.url, socket_timeout=10)


def buffer_depth(r: redis_lib.Redis, cfg: RunConfig) -> tuple[int, int]:
    """(samples on the trajectory stream, batches the trainer has not read)."""
    keys = RunKeys(cfg.run_id)
    pipe = r.pipeline(transaction=False)  # MULTI is refused at Redis's memory limit
    pipe.xlen(keys.trajectories)  # one entry per group (relayrl.contracts.streams)
    pipe.xlen(keys.batches)
    pipe.xpending(keys.batches, TRAINER_GROUP)
    groups, batches, pending = pipe.execute()
    return groups * cfg.buffer.group_size, batches - pending["pending"]


def worker_metric(cfg: RunConfig, name: str) -> list[float]:
    """`name` (its Prometheus sample name) on every worker's /metrics, by worker index."""
    values = []
    for i in range(cfg.rollout.num_workers):
        page = httpx.get(f"http://127.0.0.1:{cfg.rollout.metrics_base_port + i}/metrics",
                         timeout=10).text
        values.append(next(s.value for f in text_string_to_metric_families(page)
                           for s in f.samples if s.name == name))
    return values


def trainer_version(cfg: RunConfig) -> int:
    return int(redis_of(cfg).get(RunKeys(cfg.run_id).trainer_version) or 0)
