"""A worker verifies every shard before its engine sees it: a corrupted, truncated or
mismatched version leaves the engine whole on its previous version, and the worker fails
over to the next relay."""

import copy

import pytest
import torch

from relay_svc.server import RelayServicer, add_relay_servicer
from relay_svc.version_store import VersionStore
from relayrl.config import RunConfig
from relayrl.runtime.grpc_util import make_server
from relayrl_torch.models.loading import load_model
from relayrl_torch.weights.client import RelayClient
from rollout_svc.engines.torch import TorchEngine
from rollout_svc.worker import RolloutWorker
from tests.conftest import free_ports

SHARD = "model.embed_tokens.weight"


class LyingStore(VersionStore):
    """Holds a good version but serves altered bytes for one shard."""

    def __init__(self, tamper):
        super().__init__(keep_versions=4)
        self.tamper = tamper

    def get(self, version, complete=True):
        real = super().get(version, complete)
        fake = copy.copy(real)
        flat = self.tamper(real.flat.clone(), real.offsets[SHARD])
        fake.flat, fake._view = flat, memoryview(flat.numpy())
        fake.size = fake.filled = flat.numel()
        return fake


def flip_byte(flat: torch.Tensor, shard_offset: int) -> torch.Tensor:
    flat[shard_offset] ^= 0xFF
    return flat


def truncate(flat: torch.Tensor, shard_offset: int) -> torch.Tensor:
    return flat[:-16]


@pytest.fixture
def serve():
    servers, clients = [], []

    def start(store):
        (port,) = free_ports(1)
        server, _ = make_server(f"127.0.0.1:{port}", [
            (add_relay_servicer, RelayServicer(store, 4096))])
        server.start()
        servers.append(server)
        clients.append(RelayClient(f"127.0.0.1:{port}", chunk_bytes=4096, timeout_s=5))
        return clients[-1]

    yield start
    for c in clients:
        c.close()
    for s in servers:
        s.stop(0)


def new_version(lm) -> dict[str, torch.Tensor]:
    return {k: v + 0.01 for k, v in lm.model.state_dict().items()}


def make_worker(tiny_lm, relays):
    lm = load_model(tiny_lm.path)
    engine = TorchEngine(lm)
    return RolloutWorker(RunConfig().rollout_part(), engine, lm, scheduler=None, relays=relays,
                         writer=None, reward_name="exact_match"), lm


def snapshot(lm):
    return {k: v.clone() for k, v in lm.model.state_dict().items()}


@pytest.mark.parametrize("tamper", [flip_byte, truncate], ids=["corrupted", "truncated"])
def test_bad_shard_is_refused_and_the_next_relay_serves(tiny_lm, serve, tamper):
    bad_store, good_store = LyingStore(tamper), VersionStore(4)
    worker, lm = make_worker(tiny_lm, [serve(bad_store), serve(good_store)])
    target = new_version(lm)
    for store in (bad_store, good_store):
        store.publish(1, 1, target)
    assert worker.refresh_weights()
    assert worker.engine.version == 1 and worker.weights.pull_failures == 1
    for name, t in lm.model.state_dict().items():
        assert torch.equal(t, target[name])


@pytest.mark.parametrize("tamper", [flip_byte, truncate], ids=["corrupted", "truncated"])
def test_engine_stays_whole_when_every_relay_is_bad(tiny_lm, serve, tamper):
    store = LyingStore(tamper)
    worker, lm = make_worker(tiny_lm, [serve(store)])
    before = snapshot(lm)
    store.publish(1, 1, new_version(lm))
    assert not worker.refresh_weights()
    assert worker.engine.version == 0 and worker.weights.pull_failures == 1
    for name, t in lm.model.state_dict().items():
        assert torch.equal(t, before[name])


def test_mismatched_version_is_refused_before_any_byte_changes(tiny_lm, serve):
    store = VersionStore(4)
    worker, lm = make_worker(tiny_lm, [serve(store)])
    before = snapshot(lm)
    wrong = new_version(lm)
    wrong[SHARD] = torch.zeros(3, 3)  # verified bytes, but not this model's shape
    store.publish(1, 1, wrong)
    assert not worker.refresh_weights()
    assert worker.engine.version == 0
    for name, t in lm.model.state_dict().items():
        assert torch.equal(t, before[name])


def test_a_relay_that_is_down_is_skipped(tiny_lm, serve):
    (dead_port,) = free_ports(1)
    good = VersionStore(4)
    worker, lm = make_worker(
        tiny_lm, [RelayClient(f"127.0.0.1:{dead_port}", timeout_s=1), serve(good)])
    good.publish(1, 1, new_version(lm))
    assert worker.refresh_weights()
    assert worker.engine.version == 1 and worker.weights.pull_failures == 1
