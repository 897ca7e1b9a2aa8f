"""Tier markers follow the directory: tests/unit -> unit, tests/integration -> integration."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import redis as redis_lib

from relayrl.config import RunConfig
from relayrl.contracts import ledger as prompt_ledger
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.proto.v1 import (
    buffer_pb2,
    buffer_pb2_grpc,
    relay_pb2,
    relay_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from relayrl.runtime import grpc_util
from relayrl.runtime.grpc_util import channel, free_ports  # noqa: F401 (tests import it from here)
from relayrl_ops.audit import audit_redis

TIERS = ("unit", "integration", "chaos")


def _own_port_range() -> None:
    """Under pytest-xdist each worker (and every process it starts) draws free ports from
    its own slice of the range: workers drawing from one range could both pick a port that
    neither had bound yet, and one run's worker then called the other's server."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get(
        "PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or grpc_util.PORT_RANGE_ENV in os.environ:
        return
    low, high = grpc_util.port_range()
    size = (high - low) // int(count)
    first = low + int(worker.removeprefix("gw")) * size
    os.environ[grpc_util.PORT_RANGE_ENV] = f"{first}-{first + size - grpc_util.PORT_SPAN}"


_own_port_range()


# One tiny-model cache for the session: the warm start is most of a small stack's start-up,
# and a model's directory is named by its settings, so tests never see another's model. A
# process the tests spawn imports this module too: it finds the session's cache in its
# environment instead of making a directory that no session end removes.
_OWN_CACHE = not os.environ.get("RELAYRL_TEST_MODEL_CACHE")  # a nested pytest's is its parent's
MODEL_CACHE = Path(os.environ.get("RELAYRL_TEST_MODEL_CACHE")
                   or tempfile.mkdtemp(prefix="relayrl-test-models-"))
os.environ["RELAYRL_TEST_MODEL_CACHE"] = str(MODEL_CACHE)
# the session's small model and task: a warm start built in seconds, shared through the cache
SMALL_MODEL = {"cache_dir": str(MODEL_CACHE), "hidden_size": 32, "num_layers": 2,
               "num_heads": 2, "sft_steps": 20, "sft_stop_accuracy": 1.0}
SMALL_TASK = {"digits": 1, "eval_size": 8}


@pytest.fixture(autouse=True)
def _environment_kept():
    """Each test starts from the environment the one before it found: `relayrl up` run in
    the test's own process installs a key pair there, and a relay a later test starts would
    then refuse that test's unsigned versions."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE:
        shutil.rmtree(MODEL_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))


def small_stack_config(tmp: Path, *, steps: int, groups_per_batch: int = 2,
                       group_size: int = 4) -> dict:
    """A run config for the whole stack that starts in seconds: a tiny model (built once per
    session), few steps, every prompt accounted for (max_prompts = steps * groups_per_batch)."""
    ports = free_ports(6)
    return {
        "run_id": "itest", "run_dir": str(tmp / "run"),
        "model": dict(SMALL_MODEL), "task": dict(SMALL_TASK),
        "relay": {"endpoint": {"port": ports[0]}, "keep_versions": 3},
        "scheduler": {"endpoint": {"port": ports[1]}, "lease_ttl_s": 20,
                      "max_prompts": steps * groups_per_batch,
                      "start_after_workers": 2},
        "buffer": {"endpoint": {"port": ports[2]}, "group_size": group_size,
                   "groups_per_batch": groups_per_batch},
        "trainer": {"endpoint": {"port": ports[3]}, "max_steps": steps, "max_staleness": 1,
                    "checkpoint": {"every": 4}, "progress": False},
        "eval": {"every": 5},
        "rollout": {"base_port": ports[4], "num_workers": 2, "max_new_tokens": 3,
                    "segment_tokens": 2},
    }


# user turns end with '=', the assistant's turn opens with '+' and closes with <eos>
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}+"
            "{{ m['content'] }}{{ eos_token }}{% else %}{{ m['content'] }}={% endif %}"
            "{% endfor %}{% if add_generation_prompt %}+{% endif %}")


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """A small randomly initialised Llama model with the addition tokenizer."""
    import torch

    from relayrl.config import TinyModel
    from relayrl_tasks.tasks import AdditionTask
    from relayrl_torch.models.loading import load_model
    from relayrl_torch.models.tiny import SPECIALS, build_model, build_tokenizer

    out = tmp_path_factory.mktemp("tiny_lm")
    build_tokenizer(AdditionTask.alphabet, out)
    cfg = TinyModel(hidden_size=32, num_layers=2, num_heads=2)
    build_model(cfg, len(SPECIALS) + len(set(AdditionTask.alphabet)), out).save_pretrained(out)
    torch.manual_seed(0)
    return load_model(out)


@pytest.fixture(scope="session")
def chat_lm(tiny_lm):
    """The tiny model with TEMPLATE as its chat template (multi-turn episodes)."""
    from transformers import AutoTokenizer

    from relayrl_torch.models.loading import LoadedModel

    tokenizer = AutoTokenizer.from_pretrained(tiny_lm.path)
    tokenizer.chat_template = TEMPLATE
    return LoadedModel(tiny_lm.model, tokenizer, tiny_lm.path)


def snapshot(cfg: RunConfig) -> dict:
    """Every service's status and the run's prompt ledger, read from a running stack."""
    sched = scheduler_pb2_grpc.SchedulerStub(channel(cfg.scheduler.endpoint.address))
    buf = buffer_pb2_grpc.BufferStub(channel(cfg.buffer.endpoint.address))
    relay = relay_pb2_grpc.RelayStub(channel(cfg.relay.endpoint.address))
    workers = []
    for i in range(cfg.rollout.num_workers):
        stub = rollout_pb2_grpc.RolloutStub(channel(f"127.0.0.1:{cfg.rollout.base_port + i}"))
        workers.append(stub.Status(rollout_pb2.RolloutStatusRequest(), timeout=5))
    r = redis_lib.Redis.from_url(cfg.redis.url)
    keys = RunKeys(cfg.run_id)
    ledger = prompt_ledger.all_members(r, keys)
    return {
        "scheduler": sched.Status(scheduler_pb2.SchedulerStatusRequest(), timeout=5),
        "buffer": buf.Stats(buffer_pb2.BufferStatsRequest(), timeout=5),
        "versions": list(relay.ListVersions(relay_pb2.ListVersionsRequest(), timeout=5).versions),
        "workers": workers,
        "ledger": ledger,
        "pending_batches": r.xpending(keys.batches, "trainer")["pending"],
        "audit": audit_redis(r, cfg.run_id, cfg.trainer.max_steps),
    }


def run_to_end(cfg: RunConfig) -> tuple[RunConfig, int, dict]:
    """Start the whole stack, wait for it to finish, read its state (snapshot), stop it:
    (the launcher's config, its exit code, the state)."""
    from relayrl_ops.launcher import Launcher

    launcher = Launcher(cfg, show_trainer_output=False)
    try:
        launcher.start()
        code = launcher.wait()
        state = snapshot(launcher.cfg)
    finally:
        launcher.shutdown()
    return launcher.cfg, code, state
