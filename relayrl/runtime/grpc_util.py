"""gRPC servers and channels with the standard health service, sane limits and the run's
credentials (relayrl.runtime.auth: the token checked and sent, TLS when certificates are set)."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from relayrl.runtime import auth
from relayrl.runtime.grpc_auth import (
    BearerClientInterceptor,
    channel_credentials,
    server_credentials,
    server_interceptors,
)
from relayrl.runtime.grpc_decode import DecodeErrorInterceptor

MAX_MESSAGE_BYTES = 64 << 20
RECONNECT_BACKOFF_MAX_MS = 5000  # relayrl.runtime.outage.MAX_WAIT_S

Registrar = Callable[[Any, grpc.Server], None]


def make_server(
    address: str, servicers: list[tuple[Registrar, Any]], max_workers: int = 16,
    credentials: auth.Credentials | None = None, max_receive_bytes: int = MAX_MESSAGE_BYTES,
    max_concurrent_rpcs: int | None = None,
) -> tuple[grpc.Server, health.HealthServicer]:
    """`credentials` defaults to the process's (auth.current()). A request larger than
    `max_receive_bytes` is refused by gRPC before it is read, and a call arriving while
    `max_concurrent_rpcs` are held (None: no limit) before it runs: both RESOURCE_EXHAUSTED
    (relayrl.runtime.outage tells them apart)."""
    creds = credentials or auth.current()
    auth.check_bind(address.rpartition(":")[0], creds, f"gRPC server {address}")
    options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_receive_message_length", max_receive_bytes)]
    # the access check first: a refused caller's bytes are never parsed
    interceptors = [*server_interceptors(creds), DecodeErrorInterceptor()]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=options,
                         interceptors=interceptors, maximum_concurrent_rpcs=max_concurrent_rpcs)
    for register, servicer in servicers:
        register(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if creds.tls is not None:
        bound = server.add_secure_port(address, server_credentials(creds.tls))
    else:
        bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot bind gRPC server to {address}")
    return server, health_servicer


def channel(address: str, credentials: auth.Credentials | None = None,
            max_message_bytes: int = MAX_MESSAGE_BYTES) -> grpc.Channel:
    """A channel that sends the token and speaks TLS as `credentials` (default: the
    process's) say."""
    creds = credentials or auth.current()
    options = [("grpc.max_send_message_length", max_message_bytes),
               ("grpc.max_receive_message_length", max_message_bytes),
               # gRPC's own reconnect backoff grows to 120 s: a peer back from a long outage
               # would stay unreached that long, whatever relayrl.runtime.outage's waits (5 s at
               # most)
               ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS)]
    if creds.tls is not None:
        ch = grpc.secure_channel(address, channel_credentials(creds.tls), options=options)
    else:
        ch = grpc.insecure_channel(address, options=options)
    if creds.header is None:
        return ch
    return grpc.intercept_channel(ch, BearerClientInterceptor(creds.header,
                                                              creds.method_headers))


def check_health(address: str, timeout_s: float = 1.0) -> bool:
    with channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


class ExitedBeforeHealthy(RuntimeError):
    """The process that was to serve an address exited before it did."""


def wait_healthy(address: str, timeout_s: float = 60.0, alive: Callable[[], bool] | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check_health(address):
            return
        if alive is not None and not alive():
            raise ExitedBeforeHealthy(f"process serving {address} exited before becoming "
                                      "healthy")
        time.sleep(0.1)
    raise TimeoutError(f"{address} did not become healthy within {timeout_s:.0f}s")


# Ports this process handed out lately. Two calls a moment apart (a config's ports, then a
# test's extra one) may otherwise get the same port back from the kernel, and a run refuses
# a config that uses a port twice.
_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=4096)
_HANDED_LOCK = threading.Lock()
# A port handed out may be a base a service derives more from (worker i serves on base + i),
# so a pick keeps PORT_SPAN away from the latest _SPACED picks: a config's worker ports then
# never land on a port another pick gave its trainer.
PORT_SPAN = 8
_SPACED = 256


def reserve_ports(ports: list[int]) -> bool:
    """Keep free_ports from handing out `ports` soon (ones picked some other way); False,
    reserving nothing, when one of them was handed out lately itself."""
    with _HANDED_LOCK:
        if set(ports) & set(_HANDED_OUT):
            return False
        _HANDED_OUT.extend(ports)
        return True


# "LOW-HIGH": where free_ports draws instead. Processes that start stacks side by side (test
# workers, and the benches they run) each take a slice of their own, so one never draws a
# port another drew and has not bound yet.
PORT_RANGE_ENV = "RELAYRL_PORT_RANGE"


def port_range() -> tuple[int, int]:
    """The ports free_ports draws from: $RELAYRL_PORT_RANGE's when set, else those the
    kernel never gives an outgoing connection: below its ephemeral range, less a margin for
    the ports a service derives from a base (worker i serves on base + i)."""
    import os

    if os.environ.get(PORT_RANGE_ENV):
        text = os.environ[PORT_RANGE_ENV]
        try:
            low, high = (int(part) for part in text.split("-"))
        except ValueError:
            raise ValueError(f"${PORT_RANGE_ENV}: {text!r} is not LOW-HIGH") from None
        if not 1024 <= low < high <= 65535:
            raise ValueError(f"${PORT_RANGE_ENV}: {text!r}; need 1024 <= LOW < HIGH <= 65535")
        return low, high
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768  # Linux's default
    return 20000, max(ephemeral - 512, 20000 + 1024)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n ports free on `host` now (held together while picked), none of them handed out by
    this process lately and each at least PORT_SPAN from the others and the latest picks.
    They are drawn below the kernel's ephemeral range: a port from bind(0) is an ephemeral
    one, which the kernel may give any outgoing connection (a gRPC or Redis client's) before
    the service that was meant to have it binds it."""
    import random
    import socket

    low, high = port_range()
    draw = random.Random()  # seeded from the OS: parallel test processes draw apart
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        with _HANDED_LOCK:
            recent = set(_HANDED_OUT)
            near = {r + d for r in list(_HANDED_OUT)[-_SPACED:]
                    for d in range(1 - PORT_SPAN, PORT_SPAN)}
            for _ in range(n * 64 + 1024):
                if len(ports) == n:
                    break
                port = draw.randrange(low, high)
                if port in recent or port in near:
                    continue
                sock = socket.socket()
                try:
                    sock.bind((host, port))
                except OSError:
                    sock.close()
                    continue
                socks.append(sock)  # held bound until all n are picked
                ports.append(port)
                near.update(port + d for d in range(1 - PORT_SPAN, PORT_SPAN))
            if len(ports) < n:
                raise RuntimeError(f"no {n} fresh free ports on {host} in {low}..{high}")
            _HANDED_OUT.extend(ports)
        return ports
    finally:
        for sock in socks:
            sock.close()
