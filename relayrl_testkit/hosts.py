"""Test hosts on one machine: each host a network namespace with its own address on a test
network, a bridge in a namespace of its own as the switch between them (iproute2, root).

    with TestNetwork(["redis", "trainer", "worker"]) as net:
        net.popen("trainer", [sys.executable, "-m", ...], env)   # runs on that host
        net.cut("worker"); net.heal("worker")                     # its cable out, then in
        net.listeners("trainer")                                  # what listens there

A host reaches the others only through its one interface (eth0), so a process given an
address its host cannot reach fails as it would between machines; loopback is each host's
own. Closing the network kills every process still in a host and removes the namespaces.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

SUBNET = "10.231.7"  # hosts are .1, .2, ...; the namespaces isolate it from any other


def available() -> str | None:
    """None when test hosts can be made here, else why not."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces)"
    if shutil.which("ip") is None:
        return "test hosts need iproute2's `ip`"
    probe = f"rrl-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass(frozen=True)
class Listener:
    host: str  # the address it is bound to
    port: int


class TestNetwork:
    """Hosts named `names`, host i at SUBNET.(i+1), all on one switch."""

    def __init__(self, names: list[str]):
        tag = f"rrl{os.getpid()}"
        self.switch = f"{tag}-sw"
        self.namespaces = {name: f"{tag}-{name}" for name in names}
        self.addresses = {name: f"{SUBNET}.{i + 1}" for i, name in enumerate(names)}
        self._ports = {name: f"p{i}" for i, name in enumerate(names)}  # the switch's side
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> TestNetwork:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for name, ns in self.namespaces.items():
            port = self._ports[name]
            _ip("netns", "add", ns)
            _ip("link", "add", port, "netns", self.switch, "type", "veth", "peer", "name",
                "eth0", "netns", ns)
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{self.addresses[name]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def argv(self, host: str, argv: list[str]) -> list[str]:
        """`argv` run on `host`."""
        return ["ip", "netns", "exec", self.namespaces[host], *argv]

    def popen(self, host: str, argv: list[str], env: dict[str, str], **kwargs
              ) -> subprocess.Popen:
        """Start `argv` on `host` with exactly `env` as its environment."""
        proc = subprocess.Popen(self.argv(host, argv), env=env, **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, host: str, argv: list[str], env: dict[str, str], timeout_s: float = 120
            ) -> subprocess.CompletedProcess:
        """Run `argv` on `host` to its end: its exit code and output."""
        return subprocess.run(self.argv(host, argv), env=env, capture_output=True, text=True,
                              timeout=timeout_s)

    def cut(self, host: str) -> None:
        """Pull `host`'s cable: nothing reaches it or leaves it until heal()."""
        _ip("-n", self.switch, "link", "set", self._ports[host], "down")

    def heal(self, host: str) -> None:
        _ip("-n", self.switch, "link", "set", self._ports[host], "up")

    def pids(self, host: str) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", self.namespaces[host]],
                              capture_output=True, text=True)
        return [int(p) for p in done.stdout.split()]

    def kill(self, host: str) -> None:
        """The host dies: every process on it is killed at once (SIGKILL), its cable cut."""
        self.cut(host)
        for pid in self.pids(host):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def listeners(self, host: str) -> set[Listener]:
        """Every TCP socket listening on `host` (ss -ltn in its namespace)."""
        done = subprocess.run(self.argv(host, ["ss", "-ltnH"]), capture_output=True, text=True,
                              check=True)
        out = set()
        for line in done.stdout.splitlines():
            local = line.split()[3]
            address, _, port = local.rpartition(":")
            # gRPC binds an IPv4 address as its IPv4-mapped IPv6 one: the same address
            out.add(Listener(address.strip("[]").removeprefix("::ffff:"), int(port)))
        return out

    def close(self, grace_s: float = 20.0) -> None:
        """SIGTERM what is still running on the hosts, SIGKILL it after `grace_s`, remove
        the namespaces."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self._procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for host, ns in self.namespaces.items():
            for pid in self.pids(host):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], check=False)
        subprocess.run(["ip", "netns", "del", self.switch], check=False)
