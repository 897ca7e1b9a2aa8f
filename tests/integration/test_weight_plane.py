"""One contract for every implementation: the in-process VersionStore and a relay reached
over gRPC with each data plane (gRPC stream, shared memory, torch.distributed, NIXL, and the
nccl plane with gloo standing in: relay and worker get the CPU as their device), and a
trainer that publishes through shared memory (test_shm_handoff.py has the rest of it)."""

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys

import grpc
import pytest
import torch

from relay_svc.planes import RelayPlanes
from relay_svc.server import RelayServicer, add_relay_servicer
from relay_svc.version_store import VersionStore
from relayrl.contracts.proto.v1 import relay_pb2, relay_pb2_grpc
from relayrl.runtime.grpc_util import channel, make_server
from relayrl_torch.weights import WeightError
from relayrl_torch.weights.client import RelayClient
from tests.conftest import free_ports

KEEP = 2


# NIXL's native library (UCX) aborted this suite's long-lived process twice while loading,
# after a few hundred tests' worth of native libraries, on a loaded machine, never in a fresh
# interpreter (a relay is a process of its own): its cases run in a process of their own
# (test_the_nixl_plane_keeps_the_contract_in_a_process_of_its_own).
NIXL_HERE = os.environ.get("RELAYRL_TEST_NIXL_HERE") == "1"
PLANES = ["grpc", "shm", "torch_dist", "nccl", *(["nixl"] if NIXL_HERE else [])]
CPU = torch.device("cpu")  # the nccl plane's device here: gloo stands in for NCCL


def start_relay(tmp_path, planes: list[str], device: torch.device = CPU):
    shm_dir = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)
    store = VersionStore(KEEP, shm_dir=shm_dir, wait_timeout_s=10)
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    relay_planes = RelayPlanes(planes, "127.0.0.1", transfer_timeout_s=10, device=device)
    server, _ = make_server(address, [(add_relay_servicer,
                                       RelayServicer(store, 1024, relay_planes, 10))])
    server.start()

    def stop():
        server.stop(0)
        relay_planes.shutdown()
        store.close()

    return address, store, stop


@pytest.fixture
def relay_server(tmp_path):
    address, store, stop = start_relay(tmp_path, PLANES)
    yield address, store
    stop()


@pytest.fixture(params=["in_process", *PLANES, "shm_handoff"])
def plane(request, relay_server):
    """shm_handoff: published through shared memory (trainer.publish_plane shm), pulled
    through it too."""
    if request.param == "in_process":
        yield VersionStore(KEEP)
    else:  # small chunks force multi-chunk shards
        handoff = request.param == "shm_handoff"
        client = RelayClient(relay_server[0], chunk_bytes=1000, timeout_s=10,
                             plane="shm" if handoff else request.param, device=CPU,
                             publish_shm_dir=relay_server[1].shm_dir if handoff else None)
        yield client
        assert not handoff or client.publish_shm_dir, "the handoff fell back to gRPC"
        client.close()


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed": torch.randn(40, 16, generator=g),
            "bias": torch.randn(7, generator=g).to(torch.bfloat16),
            "empty": torch.zeros(0)}


def test_nothing_published_yet(plane):
    assert plane.manifest(0) is None
    assert plane.versions() == []


def test_publish_then_pull_returns_identical_tensors(plane):
    w = weights(1)
    sent = plane.publish(1, 10, w)
    got = plane.manifest(0)
    assert (got.version, got.step) == (1, 10)
    assert got.shards == sent.shards
    pulled = plane.pull(1)
    assert set(pulled) == set(w)
    for name, t in w.items():
        assert pulled[name].dtype == t.dtype and torch.equal(pulled[name], t)


def test_old_versions_are_freed_and_named(plane):
    for v in (1, 2, 3):
        plane.publish(v, v, weights(v))
    assert plane.versions() == [2, 3]
    assert plane.manifest(0).version == 3
    with pytest.raises(WeightError, match="oldest 2"):
        plane.pull(1)


def test_versions_must_increase(plane):
    plane.publish(2, 2, weights(2))
    with pytest.raises(WeightError, match="not newer"):
        plane.publish(1, 1, weights(1))
    assert plane.versions() == [2]


def test_a_held_version_is_immutable_and_an_identical_republish_is_a_no_op(plane):
    """A trainer resumed from a checkpoint replays the steps after it and publishes their
    versions again: identical weights are accepted without a change, others refused."""
    plane.publish(2, 2, weights(2))
    plane.publish(3, 3, weights(3))
    plane.publish(2, 2, weights(2))  # the replay: nothing stored, nothing refused
    assert plane.versions() == [2, 3]
    with pytest.raises(WeightError, match="held with other weights"):
        plane.publish(3, 3, weights(4))
    assert plane.versions() == [2, 3]
    pulled = plane.pull(3)
    assert all(torch.equal(pulled[k], t) for k, t in weights(3).items())


def test_relay_refuses_a_corrupted_shard_and_keeps_its_state(relay_server):
    address, store = relay_server
    client = RelayClient(address)
    client.publish(1, 1, weights(1))
    manifest = client.manifest(1).to_proto()
    manifest.version = 2
    other = weights(2)  # right sizes, but bytes that do not match the checksums

    def messages():
        yield relay_pb2.PublishMessage(manifest=manifest)
        for name, t in other.items():
            data = t.view(-1).view(torch.uint8).numpy().tobytes()
            yield relay_pb2.PublishMessage(chunk=relay_pb2.ShardChunk(shard=name, data=data))

    stub = relay_pb2_grpc.RelayStub(channel(address))
    with pytest.raises(grpc.RpcError) as info:
        stub.Publish(messages(), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "checksum mismatch" in info.value.details()
    assert store.versions() == [1]


def test_relay_refuses_a_stream_without_manifest(relay_server):
    address, store = relay_server
    stub = relay_pb2_grpc.RelayStub(channel(address))
    bad = iter([relay_pb2.PublishMessage(chunk=relay_pb2.ShardChunk(shard="x", data=b"1"))])
    with pytest.raises(grpc.RpcError) as info:
        stub.Publish(bad, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "manifest" in info.value.details()
    assert store.versions() == []


def test_verify_rejects_truncated_and_altered_bytes():
    from relayrl_torch.weights import build_manifest, verify_shard

    t = torch.arange(6, dtype=torch.float32)
    info = build_manifest(1, 1, {"t": t}).shard("t")
    data = bytearray(t.numpy().tobytes())
    assert torch.equal(verify_shard(info, data), t)
    with pytest.raises(WeightError, match="bytes"):
        verify_shard(info, data[:-1])
    data[0] ^= 1
    with pytest.raises(WeightError, match="checksum"):
        verify_shard(info, data)


def test_shared_memory_needs_the_same_host(relay_server):
    address, _ = relay_server
    client = RelayClient(address, plane="shm")
    client.publish(1, 1, weights(1))
    stub = relay_pb2_grpc.RelayStub(channel(address))
    with pytest.raises(grpc.RpcError) as info:
        stub.OpenPull(relay_pb2.OpenPullRequest(
            version=1, plane=relay_pb2.DATA_PLANE_SHM, host_id="elsewhere"), timeout=5)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "host_id" in info.value.details()


def test_a_plane_the_relay_does_not_serve_is_refused(tmp_path):
    address, _, stop = start_relay(tmp_path, ["grpc", "shm"])
    try:
        client = RelayClient(address, plane="torch_dist")
        client.publish(1, 1, weights(1))
        with pytest.raises(WeightError, match="'torch_dist' is not enabled"):
            client.pull(1)
    finally:
        stop()


def test_a_pulled_tensor_does_not_alias_the_relay(plane):
    plane.publish(1, 1, weights(1))
    first = plane.pull(1)
    first["embed"].add_(1.0)
    assert torch.equal(plane.pull(1)["embed"], weights(1)["embed"])


def test_relay_refuses_a_far_future_version_and_the_next_one_goes_through(relay_server):
    """latest + 1,000,000 used to be stored and then refuse every later
    publish of the trainer as "not newer". A publish may go at most relay.max_version_gap past
    the latest (the trainer's skipped versions); an empty relay takes any version."""
    address, store = relay_server
    client = RelayClient(address, timeout_s=10)
    client.publish(7, 7, weights(7))  # first: any version
    with pytest.raises(WeightError, match=r"max_version_gap \(1000\) past the latest version 7"):
        client.publish(7 + 1_000_000, 1, weights(1))
    assert store.versions() == [7] and store.pending_version() == 0
    client.publish(8, 8, weights(8))  # the trainer's next version is taken
    client.publish(8 + 1000, 9, weights(9))  # a gap the trainer may leave: at the bound
    assert store.versions() == [8, 1008]
    client.close()


def test_a_repeated_publish_of_the_latest_version_answers_ok_and_changes_nothing(relay_server):
    """A publish whose reply was lost is retried: the same version, the same manifest."""
    address, store = relay_server
    client = RelayClient(address, timeout_s=10)
    client.publish(1, 1, weights(1))
    stats = dataclasses.replace(store.stats)
    publish = channel(address).stream_unary(
        "/relayrl.v1.Relay/Publish", request_serializer=lambda raw: raw,
        response_deserializer=relay_pb2.PublishResponse.FromString)
    reply = publish(client._messages(client.manifest(1), weights(1)), timeout=10)
    assert (reply.version, reply.bytes_received) == (1, 0)
    assert store.versions() == [1] and store.stats == stats
    assert all(torch.equal(client.pull(1)[k], t) for k, t in weights(1).items())
    client.close()


def test_a_resumed_trainer_replays_what_is_held_and_goes_on_from_the_latest(relay_server):
    """A trainer restarted from a checkpoint at version 2 while the relay holds up to 4
    publishes 2, 3, 4 again, then 5. A version is immutable: an identical replay is a no-op,
    a different one is refused (the workers keep 4), and 5 = latest + 1 is taken."""
    address, store = relay_server
    client = RelayClient(address, timeout_s=10)
    for v in (1, 2, 3, 4):
        client.publish(v, v, weights(v))
    client.publish(3, 3, weights(3))  # bit-exact replay, still held: OK, nothing changes
    with pytest.raises(WeightError, match="held with other weights"):
        client.publish(4, 4, weights(40))
    with pytest.raises(WeightError, match="not newer"):
        client.publish(2, 2, weights(20))  # no longer held (keep_versions=2)
    assert store.versions() == [3, 4]
    client.publish(5, 5, weights(5))
    assert store.versions() == [4, 5]
    client.close()


@pytest.mark.skipif(NIXL_HERE, reason="this is the process of its own")
def test_the_nixl_plane_keeps_the_contract_in_a_process_of_its_own():
    if not any(importlib.util.find_spec(m) for m in ("nixl_cu12", "nixl")):  # no import here
        pytest.skip("nixl-cu12 is not installed")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider", "-k", "nixl"],
        env={**os.environ, "RELAYRL_TEST_NIXL_HERE": "1"}, capture_output=True, text=True,
        timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    passed = re.search(r"(\d+) passed", out.stdout)
    assert passed and int(passed.group(1)) >= 5, out.stdout[-2000:]

