"""One contract, two implementations: the in-process VersionStore and the gRPC relay."""

import grpc
import pytest
import torch

from relay_svc.server import RelayServicer
from relayrl.grpc_util import channel, make_server
from relayrl.proto.v1 import relay_pb2, relay_pb2_grpc
from relayrl.weights import VersionStore, WeightError
from relayrl.weights.client import RelayClient
from tests.conftest import free_ports

KEEP = 2


@pytest.fixture
def relay_server():
    store = VersionStore(KEEP)
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    server, _ = make_server(address, [(relay_pb2_grpc.add_RelayServicer_to_server,
                                       RelayServicer(store, chunk_bytes=1024))])
    server.start()
    yield address, store
    server.stop(0)


@pytest.fixture(params=["in_process", "grpc"])
def plane(request, relay_server):
    if request.param == "in_process":
        yield VersionStore(KEEP)
    else:
        client = RelayClient(relay_server[0], chunk_bytes=1000)  # forces multi-chunk shards
        yield client
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
        plane.publish(2, 2, weights(3))
    assert plane.versions() == [2]


def test_relay_refuses_a_corrupted_shard_and_keeps_its_state(relay_server):
    address, store = relay_server
    client = RelayClient(address)
    client.publish(1, 1, weights(1))
    manifest = client.manifest(1).to_proto()
    manifest.version = 2
    good = weights(2)["embed"].numpy().tobytes()  # bytes that do not match the checksum

    def messages():
        yield relay_pb2.PublishMessage(manifest=manifest)
        yield relay_pb2.PublishMessage(chunk=relay_pb2.ShardChunk(shard="embed", data=good))

    stub = relay_pb2_grpc.RelayStub(channel(address))
    with pytest.raises(grpc.RpcError) as info:
        stub.Publish(messages(), timeout=5)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "checksum" in info.value.details() or "bytes" in info.value.details()
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
    from relayrl.weights import build_manifest, verify_shard

    t = torch.arange(6, dtype=torch.float32)
    info = build_manifest(1, 1, {"t": t}).shard("t")
    data = bytearray(t.numpy().tobytes())
    assert torch.equal(verify_shard(info, data), t)
    with pytest.raises(WeightError, match="bytes"):
        verify_shard(info, data[:-1])
    data[0] ^= 1
    with pytest.raises(WeightError, match="checksum"):
        verify_shard(info, data)
