"""The nccl weight plane beyond the shared contract (test_weight_plane.py runs that for it):
the relay's device copy, groups that workers join and leave, verification of what arrives,
and the refusal to start without CUDA. On the CPU gloo stands in for NCCL (the same code,
the device injected); the `gpu`-marked case runs real NCCL between two GPUs."""

import threading

import pytest
import torch

from relay_svc.planes import RelayPlanes
from relayrl.config import RunConfig
from relayrl.contracts.proto.v1 import relay_pb2, relay_pb2_grpc
from relayrl.runtime.grpc_util import channel
from relayrl_torch.weights import WeightError
from relayrl_torch.weights.client import RelayClient
from relayrl_torch.weights.collective import worker_device
from relayrl_torch.weights.fetchers import fetch_torch_dist
from tests.integration.test_weight_plane import CPU, start_relay, weights


@pytest.fixture
def relay(tmp_path):
    address, store, stop = start_relay(tmp_path, ["grpc", "nccl"])
    yield address, store
    stop()


def nccl_client(address: str, device: torch.device = CPU) -> RelayClient:
    return RelayClient(address, timeout_s=10, plane="nccl", device=device)


def test_a_corrupted_byte_in_the_relays_device_copy_never_reaches_the_engine(relay):
    address, store = relay
    client = nccl_client(address)
    client.publish(1, 1, weights(1))
    assert torch.equal(client.pull(1)["embed"], weights(1)["embed"])
    store.get(1).on_device(CPU)[5] ^= 1  # the copy the broadcast sends, not the stored bytes
    with pytest.raises(WeightError, match="shard 'embed': checksum mismatch"):
        client.pull(1)
    grpc_pulled = RelayClient(address, timeout_s=10).pull(1)  # the version itself is intact
    assert torch.equal(grpc_pulled["embed"], weights(1)["embed"])
    client.close()


def test_the_device_copy_is_made_once_and_freed_with_its_version(relay):
    address, store = relay
    client = nccl_client(address)
    client.publish(1, 1, weights(1))
    stored = store.get(1)
    client.pull(1)
    copy = stored.on_device(CPU)
    assert copy.data_ptr() != stored.flat.data_ptr()
    client.pull(1)
    assert stored.on_device(CPU) is copy
    for v in (2, 3):  # keep_versions=2: version 1 is dropped
        client.publish(v, v, weights(v))
    assert stored.released
    with pytest.raises(WeightError, match="released"):
        stored.on_device(CPU)
    assert torch.equal(client.pull(3)["embed"], weights(3)["embed"])
    client.close()


def test_workers_join_and_leave_at_any_time(relay):
    """A worker that takes a ticket and never joins holds up no one; concurrent pulls each
    get a group of their own."""
    address, _ = relay
    client = nccl_client(address)
    client.publish(1, 1, weights(1))
    stub = relay_pb2_grpc.RelayStub(channel(address))
    stub.OpenPull(relay_pb2.OpenPullRequest(version=1, plane=relay_pb2.DATA_PLANE_NCCL),
                  timeout=5)  # and then leaves
    results, errors = [], []

    def pull():
        try:
            c = nccl_client(address)
            results.append(c.pull(1))
            c.close()
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=pull) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(results) == 3
    assert all(torch.equal(r["embed"], weights(1)["embed"]) for r in results)
    client.close()


def test_a_ticket_for_another_backend_than_the_workers_device_is_refused():
    ticket = relay_pb2.TorchDistTicket(rendezvous_id="0" * 32, backend="nccl", timeout_s=1)
    with pytest.raises(WeightError, match="receives on cpu, which needs gloo"):
        fetch_torch_dist(ticket, torch.empty(8, dtype=torch.uint8), None, "127.0.0.1")


def test_the_nccl_plane_is_a_configuration_choice():
    cfg = RunConfig(relay={"data_planes": ["grpc", "nccl"], "device": "cuda:1"},
                    rollout={"weight_plane": "nccl", "engine": {"device": "cuda:0"}})
    assert cfg.rollout.weight_plane == "nccl" and cfg.relay.device == "cuda:1"
    with pytest.raises(ValueError, match="relay.device"):
        RunConfig(relay={"device": "gpu0"})
    assert worker_device("grpc", "auto") is None  # the host planes need no device


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_without_cuda_a_relay_or_worker_set_for_nccl_refuses_to_start():
    with pytest.raises(ValueError, match=r"relay.data_planes: the 'nccl' plane needs CUDA, "
                       r"and relay.device='auto' resolves to cpu"):
        RelayPlanes(["grpc", "nccl"], "127.0.0.1", 10)  # what relay_svc.serve builds first
    with pytest.raises(ValueError, match=r"rollout.weight_plane: the 'nccl' plane needs "
                       r"CUDA, and rollout.engine.device='cpu'"):
        worker_device("nccl", "cpu")  # what rollout_svc.serve asks before loading a model
    RelayPlanes(["grpc", "torch_dist"], "127.0.0.1", 10)  # other planes need no GPU


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (NCCL refuses "
                    f"two ranks on one GPU); this machine has {torch.cuda.device_count()}")
def test_real_nccl_moves_a_version_gpu_to_gpu_and_refuses_a_corrupted_one(tmp_path):
    relay_gpu, worker_gpu = torch.device("cuda", 0), torch.device("cuda", 1)
    address, store, stop = start_relay(tmp_path, ["grpc", "nccl"], device=relay_gpu)
    try:
        client = nccl_client(address, worker_gpu)
        client.publish(1, 1, weights(1))
        pulled = client.pull(1)
        assert store.get(1).on_device(relay_gpu).device == relay_gpu
        for name, t in weights(1).items():
            assert pulled[name].device == worker_gpu and torch.equal(pulled[name].cpu(), t)
        store.get(1).on_device(relay_gpu)[5] ^= 1
        with pytest.raises(WeightError, match="checksum mismatch"):
            client.pull(1)
        client.close()
    finally:
        stop()
