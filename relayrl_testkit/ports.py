"""Free ports for stacks that tests and benchmarks start beside each other on one machine."""

from __future__ import annotations

import socket

from relayrl.runtime.grpc_util import free_ports, reserve_ports


def free_port_block(n: int, host: str = "127.0.0.1", tries: int = 50) -> int:
    """The first of n consecutive ports that are all free now."""
    for _ in range(tries):
        first = free_ports(1, host)[0]
        if first + n > 65000:
            continue
        socks = [socket.socket() for _ in range(n)]
        try:
            for offset, sock in enumerate(socks):
                sock.bind((host, first + offset))
            # its first port is fresh; the rest must not be another caller's either
            if reserve_ports(list(range(first + 1, first + n))):
                return first
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no block of {n} free ports on {host} after {tries} tries")
