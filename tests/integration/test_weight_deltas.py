"""Workers that hold a version pull the next one as its changes, from real relay processes:
the root and a child relay that follows it. The weights they end with pass the manifest's
checksums and equal the trainer's; a worker whose version the relay no longer keeps gets
the whole version; a delta that does not build the version is refused, counted, and the
whole version pulled instead."""

import dataclasses
import os
import subprocess
import sys
import time

import pytest
import torch
import yaml

from relay_svc.delta_cache import DeltaCache
from relay_svc.server import RelayServicer, add_relay_servicer
from relay_svc.version_store import VersionStore
from relayrl.runtime import auth
from relayrl.runtime.grpc_util import make_server, wait_healthy
from relayrl_torch.models.loading import load_model
from relayrl_torch.weights.client import RelayClient
from relayrl_torch.weights.layout import flat_size
from tests.conftest import free_ports

pytestmark = pytest.mark.integration

TOKEN = "weight-delta-token"


def relay_process(tmp_path, name: str, upstream: list[str] | None = None):
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / name), "relay": {
        "endpoint": {"port": port}, "keep_versions": 2, "upstream": upstream or [],
        "follow_poll_s": 0.01, "timeout_s": 30}}))
    # the run's one token and no keys: a role token would split the roles, a verify key
    # would make the relay refuse the unsigned versions published here
    env = {**{k: v for k, v in os.environ.items()
              if not (k.startswith("RELAYRL_") and k.endswith(("TOKEN", "_KEY")))},
           "RELAYRL_TOKEN": TOKEN}
    with open(tmp_path / f"{name}.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "relay_svc", "--config", str(path)],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    wait_healthy(address, 60, alive=lambda: proc.poll() is None)
    return proc, address


@pytest.fixture
def relays(tmp_path):
    """(root, child): relay processes, the child following the root."""
    auth.install(auth.Credentials(token=TOKEN))
    procs = []
    try:
        root, root_address = relay_process(tmp_path, "root")
        procs.append(root)
        child, child_address = relay_process(tmp_path, "child", [root_address])
        procs.append(child)
        yield root_address, child_address
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
        auth.install(None)


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed": torch.randn(512, 256, generator=g).to(torch.bfloat16),
            "norm": torch.ones(256, dtype=torch.bfloat16),
            "head": torch.randn(256, 128, generator=g).to(torch.bfloat16)}


def step(tensors: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """About 2% of the elements moved, as a few optimizer steps move bfloat16 weights."""
    g = torch.Generator().manual_seed(seed)
    return {k: torch.where(torch.rand(t.shape, generator=g) < 0.02,
                           (t.float() * 1.1 + 0.01).to(t.dtype), t)
            for k, t in tensors.items()}


def wait_for(client: RelayClient, version: int) -> None:
    deadline = time.monotonic() + 30
    while version not in client.versions():
        assert time.monotonic() < deadline, f"version {version} never arrived"
        time.sleep(0.01)


def assert_holds(pulled: dict[str, torch.Tensor], published: dict[str, torch.Tensor]) -> None:
    assert pulled.keys() == published.keys()
    for name, t in published.items():
        assert torch.equal(pulled[name], t), name


def test_workers_pull_the_next_version_as_a_delta_through_root_and_child(relays):
    root_address, child_address = relays
    trainer = RelayClient(root_address, timeout_s=30)
    versions = {1: weights()}
    trainer.publish(1, 1, versions[1])
    workers = [RelayClient(a, timeout_s=30) for a in (root_address, child_address)]
    staging = {id(w): torch.empty(flat_size(trainer.manifest(1)), dtype=torch.uint8)
               for w in workers}
    wait_for(workers[1], 1)
    for w in workers:
        assert_holds(w.pull(1, staging=staging[id(w)]), versions[1])
        assert w.deltas_applied == 0

    versions[2] = step(versions[1], seed=2)
    trainer.publish(2, 2, versions[2])
    wait_for(workers[1], 2)
    whole = flat_size(trainer.manifest(2))
    for w in workers:
        assert_holds(w.pull(2, staging=staging[id(w)]), versions[2])
        assert w.deltas_applied == 1 and w.deltas_refused == 0
        assert w.last_pull_bytes < whole / 4, (w.address, w.last_pull_bytes, whole)

    for v in (3, 4):  # the relays keep two versions: 2 goes
        versions[v] = step(versions[v - 1], seed=v)
        trainer.publish(v, v, versions[v])
        wait_for(workers[1], v)  # the child copies the newest only: let it take each
    for w in workers:
        assert 2 not in w.versions()
        assert_holds(w.pull(4, staging=staging[id(w)]), versions[4])
        assert w.deltas_applied == 1 and w.deltas_refused == 0
        assert w.last_pull_bytes == whole
    versions[5] = step(versions[4], seed=5)  # and from 4, a delta again
    trainer.publish(5, 5, versions[5])
    wait_for(workers[1], 5)
    for w in workers:
        assert_holds(w.pull(5, staging=staging[id(w)]), versions[5])
        assert w.deltas_applied == 2


@pytest.fixture
def relay():
    store = VersionStore(2, wait_timeout_s=10)
    deltas = DeltaCache(store, 1 << 24)
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    server, _ = make_server(address, [(add_relay_servicer, RelayServicer(
        store, 4096, stall_timeout_s=10, deltas=deltas))])
    server.start()
    yield address, store, deltas
    server.stop(0)
    store.close()


def test_a_delta_that_does_not_build_the_version_is_refused_and_the_whole_pulled(relay):
    address, store, deltas = relay
    versions = {1: weights(), 2: step(weights(), seed=2)}
    store.publish(1, 1, versions[1])
    worker = RelayClient(address, timeout_s=10)
    worker.pull(1)
    store.publish(2, 2, versions[2])
    good = deltas.get(1, 2)
    header = good.header()
    header.shards[0].changed += 1  # one more change than the code holds
    deltas._held[(1, 2)] = dataclasses.replace(good, shards=tuple(header.shards))
    assert_holds(worker.pull(2), versions[2])
    assert (worker.deltas_refused, worker.deltas_applied) == (1, 0)
    assert worker.last_pull_bytes == flat_size(store.manifest(2))

    # a well-formed delta onto bytes that are no longer the base: the checksums refuse it
    versions[3] = step(versions[2], seed=3)
    store.publish(3, 3, versions[3])
    worker._held[1][:64] ^= 0xFF
    assert_holds(worker.pull(3), versions[3])
    assert (worker.deltas_refused, worker.deltas_applied) == (2, 0)


def test_a_worker_counts_the_bytes_a_delta_moved(relay, tiny_lm):
    from rollout_svc.engines.torch import TorchEngine
    from rollout_svc.weight_refresh import WeightRefresher

    address, store, _ = relay
    lm = load_model(tiny_lm.path)
    state = {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    store.publish(1, 1, state)
    refresher = WeightRefresher(TorchEngine(lm), [RelayClient(address, timeout_s=10)])
    assert refresher.refresh() and refresher.engine.version == 1
    whole = refresher.bytes_pulled
    assert whole >= store.manifest(1).total_bytes and refresher.deltas_applied == 0
    name = next(iter(state))
    state[name] = state[name].clone()
    state[name].view(-1)[:4] += 1  # four elements of one tensor move
    store.publish(2, 2, state)
    assert refresher.refresh() and refresher.engine.version == 2
    assert refresher.deltas_applied == 1 and refresher.deltas_refused == 0
    assert 0 < refresher.bytes_pulled - whole < whole / 100
