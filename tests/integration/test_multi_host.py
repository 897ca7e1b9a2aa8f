"""The run across real network hosts: every service on a host of its own (a network
namespace with its own address, relayrl_testkit.hosts), Redis on another, TLS on every link,
each host's share started by `relayrl up CONFIG --node K` with the run's tokens and keys in
its environment, each in a run directory of its own. Mid-run one rollout host's cable is
pulled for 60 s and plugged back, the other rollout host dies outright, and the child relay's
host drops off the network; training goes on through each, the graceful stop ends it, and
`relayrl audit` balances. Every address a service was given is one its host reaches, each
host listens on exactly what the config names there, and every listener refuses plaintext.

Root only (network namespaces); Redis is Debian's redis-server, built with TLS
(`make test` installs it where it can)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from relayrl.config import RunConfig, load_run_config
from relayrl.runtime.metrics import read_metrics
from relayrl.runtime.signing import new_key_pair
from relayrl_ops.plan import on_node, plan
from relayrl_testkit import hosts
from tests.conftest import SMALL_MODEL, SMALL_TASK
from tests.integration.tls_certs import self_signed

ROOT = Path(__file__).resolve().parents[2]
NODES = ["trainer", "relay", "scheduler", "buffer", "child-relay", "rollout-a", "rollout-b"]
HOSTS = ["redis", *NODES, "operator"]  # the operator runs the CLI: audit, services, stop
RUN_ID = "tiny"  # deploy/redis/users.acl scopes the ACL user to relayrl:tiny:*
REDIS_PORT, REST_PORT = 6379, 8443
CUT_S = 60
PHASE_S = 240  # for the run to show a phase's effect (steps, a worker's versions)

why_not = hosts.available() or (None if shutil.which("redis-server") else
                                "Debian's redis-server (TLS) is not installed")
pytestmark = [pytest.mark.integration, pytest.mark.skipif(why_not is not None,
                                                          reason=why_not or "")]


def run_config(tmp: Path, a: dict[str, str], tls: dict[str, str]) -> dict:
    """Each service on its own node at its host's address; workers pull from the child relay
    first, then the root; nothing but gRPC carries weights (no shared memory across hosts)."""
    node = {name: i for i, name in enumerate(NODES)}
    return {
        "run_id": RUN_ID, "run_dir": str(tmp / "run"),
        "model": dict(SMALL_MODEL), "task": dict(SMALL_TASK),
        "auth": {"tls": tls, "redis_password_env": "RELAYRL_REDIS_PASSWORD"},
        "redis": {"url": f"rediss://relayrl@{a['redis']}:{REDIS_PORT}/0"},
        "resources": {
            "nodes": [{"address": a[name]} for name in NODES],
            **{name: {"node": node[name]} for name in ("trainer", "relay", "scheduler",
                                                       "buffer")},
            "relay_children": [{"node": node["child-relay"]}],
            "rollout": [{"node": node["rollout-a"]}, {"node": node["rollout-b"]}]},
        "relay": {"endpoint": {"host": a["relay"], "port": 50551}, "children": 1,
                  "children_base_port": 50540, "keep_versions": 3, "data_planes": ["grpc"]},
        "scheduler": {"endpoint": {"host": a["scheduler"], "port": 50552}, "lease_ttl_s": 10,
                      "max_prompts": 0, "start_after_workers": 2, "rest_port": REST_PORT,
                      "rest_host": a["scheduler"]},
        "buffer": {"endpoint": {"host": a["buffer"], "port": 50553}, "group_size": 4,
                   "groups_per_batch": 2},
        "trainer": {"endpoint": {"host": a["trainer"], "port": 50554}, "max_steps": 100000,
                    "max_staleness": 1, "checkpoint": {"every": 5}, "progress": False,
                    "publish_plane": "grpc"},
        "eval": {"every": 0},
        "rollout": {"base_port": 50560, "num_workers": 2, "max_new_tokens": 3,
                    "segment_tokens": 2, "weight_plane": "grpc"},
    }


def secrets_of(host: str, keys: dict[str, str]) -> dict[str, str]:
    """What each host's environment holds: the service token and the trainer's public key
    everywhere; the trainer token where the trainer and the root relay run; the signing key
    on the trainer's host alone; the operator host only the operator token."""
    if host == "operator":
        return {"RELAYRL_OPERATOR_TOKEN": keys["operator"],
                "RELAYRL_REDIS_PASSWORD": keys["redis"]}
    env = {"RELAYRL_TOKEN": keys["service"], "RELAYRL_AGENT_TOKEN": keys["agent"],
           "RELAYRL_OPERATOR_TOKEN": keys["operator"], "RELAYRL_VERIFY_KEY": keys["verify"],
           "RELAYRL_REDIS_PASSWORD": keys["redis"]}
    if host in ("trainer", "relay"):
        env["RELAYRL_TRAINER_TOKEN"] = keys["trainer"]
    if host == "trainer":
        env["RELAYRL_SIGNING_KEY"] = keys["signing"]
    return env


class Run:
    """The run on the test network: what each host was started with, and what it says."""

    def __init__(self, net: hosts.TestNetwork, tmp: Path, config: Path, keys: dict):
        self.net, self.tmp, self.config, self.keys = net, tmp, config, keys
        self.cfg = RunConfig.model_validate(yaml.safe_load(config.read_text()))
        self.launchers: dict[str, subprocess.Popen] = {}
        self.alive = set(NODES)  # the hosts whose launchers must keep running

    def env(self, host: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("RELAYRL_")}
        return {**base, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
                **secrets_of(host, self.keys)}

    def run_dir(self, host: str) -> Path:
        return self.tmp / "hosts" / host

    def up(self, host: str) -> None:
        out = open(self.tmp / f"{host}.out", "w")  # noqa: SIM115 (the process keeps it)
        self.launchers[host] = self.net.popen(
            host, [sys.executable, "-m", "relayrl_ops.cli", "up", str(self.config), "--node",
                   str(NODES.index(host)), "--set", f"run_dir={self.run_dir(host)}"],
            self.env(host), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """`relayrl ARGS` on the operator's host, with its run directory's config."""
        done = self.net.run("operator", [sys.executable, "-m", "relayrl_ops.cli", *args],
                            self.env("operator"))
        if check:
            assert done.returncode == 0, f"relayrl {args[0]}: {done.stdout}{done.stderr}"
        return done

    def services(self) -> dict:
        return json.loads(self.cli("services", str(self.config)).stdout)

    def step(self) -> int:
        rows = read_metrics(self.run_dir("trainer") / "metrics.jsonl")
        return max((r["step"] for r in rows if "train/loss" in r), default=0)

    def wait_for(self, what: str, done, timeout_s: float = PHASE_S) -> None:
        t0 = time.monotonic()
        print(f"PHASE start {what} at step {self.step()}", flush=True)
        deadline = time.monotonic() + timeout_s
        while not done():
            dead = {h: p.returncode for h, p in self.launchers.items()
                    if p.poll() is not None and h in self.alive}
            assert not dead, f"waiting for {what}: launchers exited {dead}\n{self.tails()}"
            assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s\n" \
                                                f"{self.tails()}"
            time.sleep(1)
        print(f"PHASE done {what} in {time.monotonic() - t0:.1f}s step {self.step()}", flush=True)

    def advances(self, steps: int, what: str) -> None:
        target = self.step() + steps
        self.wait_for(f"{what}: step {target}", lambda: self.step() >= target)

    def tails(self) -> str:
        out = []
        for host in self.launchers:
            for log in sorted((self.run_dir(host) / "logs").glob("*.log")):
                lines = log.read_text(errors="replace").splitlines()[-8:]
                out.append(f"--- {host}/{log.name}\n" + "\n".join(lines))
            text = (self.tmp / f"{host}.out").read_text(errors="replace").splitlines()[-5:]
            out.append(f"--- {host} launcher\n" + "\n".join(text))
        return "\n".join(out)


def start_redis(net: hosts.TestNetwork, tmp: Path, tls: dict[str, str], password: str):
    """deploy/redis/start.sh, TLS only (no plaintext port), on the Redis host."""
    data = tmp / "redis"
    data.mkdir()
    env = {**os.environ, "RELAYRL_REDIS_PASSWORD": password,
           "RELAYRL_REDIS_ACL": str(data / "users.acl")}
    return net.popen("redis", [
        "sh", str(ROOT / "deploy/redis/start.sh"), "--dir", str(data), "--port", "0",
        "--bind", net.addresses["redis"], "--tls-port", str(REDIS_PORT),
        "--tls-cert-file", tls["cert"], "--tls-key-file", tls["key"],
        "--tls-ca-cert-file", tls["ca"], "--tls-auth-clients", "optional"], env,
        stdout=open(tmp / "redis.out", "w"), stderr=subprocess.STDOUT)  # noqa: SIM115


PROBE = """
import socket, sys, json
out = {}
for address in sys.argv[1:]:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"PING\\r\\n\\r\\n")
        s.settimeout(5)
        try:
            out[address] = s.recv(64).hex()
        except (socket.timeout, ConnectionResetError):
            out[address] = ""
print(json.dumps(out))
"""


def expected_listeners(cfg: RunConfig, a: dict[str, str]) -> dict[str, set[hosts.Listener]]:
    """Host -> what the config makes listen there: each process's ports (the plan), at its
    node's address."""
    out = {"redis": {hosts.Listener(a["redis"], REDIS_PORT)}, "operator": set()}
    processes = plan(cfg)
    for k, name in enumerate(NODES):
        out[name] = {hosts.Listener(a[name], port)
                     for p in on_node(processes, k) for port in p.ports.values()}
    return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hosts")
    from relayrl.config import TinyModel
    from relayrl.config.task import AdditionTaskConfig
    from relayrl_torch.models import resolve_model_path
    resolve_model_path(TinyModel(**SMALL_MODEL), AdditionTaskConfig(**SMALL_TASK))
    signing, verify = new_key_pair()
    keys = {role: os.urandom(16).hex() for role in ("service", "agent", "operator",
                                                    "trainer", "redis")}
    keys.update(signing=signing, verify=verify)
    with hosts.TestNetwork(HOSTS) as net:
        a = net.addresses
        cert, key = self_signed(tmp, *(a[h] for h in HOSTS))
        tls = {"cert": str(cert), "key": str(key), "ca": str(cert)}
        config = tmp / "run.yaml"
        config.write_text(yaml.safe_dump(run_config(tmp, a, tls), sort_keys=False))
        run = Run(net, tmp, config, keys)
        redis = start_redis(net, tmp, tls, keys["redis"])
        for host in NODES:
            run.up(host)
        try:
            yield run
        finally:
            for proc in run.launchers.values():
                if proc.poll() is None:
                    proc.terminate()
            for proc in run.launchers.values():
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
            redis.terminate()


def test_every_host_listens_on_what_the_config_names_there_and_only_over_tls(stack):
    run = stack
    run.advances(2, "the run's first steps")
    a = run.net.addresses
    expected = expected_listeners(run.cfg, a)
    for host in HOSTS:
        assert run.net.listeners(host) == expected[host], host
    listeners = sorted(f"{lis.host}:{lis.port}" for got in expected.values() for lis in got)
    probe = run.net.run("operator", [sys.executable, "-c", PROBE, *listeners], {})
    replies = json.loads(probe.stdout)
    # a TLS server answers plaintext with an alert record (0x15) or hangs up
    assert all(r == "" or r.startswith("15") for r in replies.values()), replies
    # every address a process dials or binds, as its node's launcher gave it (the run's
    # config and the process's own overrides), is a host of the network; a worker's own
    # address (rollout.host) is only a worker's to bind and register
    reachable = set(a.values())
    for k, host in enumerate(NODES):
        written = run.run_dir(host) / "config.yaml"
        for p in on_node(plan(load_run_config(written)), k):
            given = load_run_config(written, list(p.overrides)).network_hosts()
            if p.module != "rollout_svc":
                given = {f: h for f, h in given.items() if not f.startswith("rollout.")
                         or f == "rollout.relays"}
            assert set(given.values()) <= reachable, (p.name, given)
    workers = run.services()
    assert {w["worker_id"] for k, w in workers.items() if k.startswith("rollout")} == {
        "rollout-0", "rollout-1"}


def test_training_rides_out_a_cut_a_dead_host_and_a_lost_child_relay(stack):
    run = stack
    run.advances(1, "the run")
    run.net.cut("rollout-a")  # rollout worker 0's cable out for a minute
    cut_at = time.monotonic()
    run.advances(3, "training on rollout-b alone while rollout-a is cut off")
    time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
    run.net.heal("rollout-a")
    generated = run.services()["rollout-0"]["samples_generated"]
    run.wait_for("rollout-a back at work",
                 lambda: int(run.services()["rollout-0"]["samples_generated"]) > int(generated))

    run.alive.discard("rollout-b")
    run.net.kill("rollout-b")  # worker 1's host dies with its leases
    run.advances(3, "training on rollout-a alone")

    run.alive.discard("child-relay")
    run.net.cut("child-relay")  # the relay rollout-a pulls from first
    seen = run.step()  # a version is a step's weights
    run.advances(20, "training with the child relay gone")
    run.wait_for("rollout-a on a version published after the child relay left",
                 lambda: int(run.services()["rollout-0"]["policy_version"]) > seen)
    log = (run.run_dir("rollout-a") / "logs" / "rollout-0.log").read_text()
    root = run.cfg.relay.endpoint.address
    assert f"relay {run.cfg.child_relay_addresses[0]} did not answer" in log
    assert f"from {root}" in log.rsplit("did not answer", 1)[1]  # pulled from the root

    assert run.cli("stop", "--config", str(run.config)).returncode == 0
    trainer = run.launchers["trainer"]
    trainer.wait(PHASE_S)
    out = (run.tmp / "trainer.out").read_text()
    assert trainer.returncode == 0, out[-3000:]
    (run.tmp / "audit").mkdir()
    audit = run.cli("audit", str(run.config), "--set", f"run_dir={run.tmp / 'audit'}",
                    check=False)
    assert audit.returncode == 0, audit.stdout + audit.stderr
