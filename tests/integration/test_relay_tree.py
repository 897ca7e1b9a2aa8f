"""A relay that follows another re-serves each version while it is still arriving, and a
version that fails upstream never becomes readable downstream."""

import threading
import time

import grpc
import pytest
import torch

from relay_svc.follower import Follower
from relay_svc.server import RelayServicer, add_relay_servicer
from relay_svc.version_store import VersionStore
from relayrl.contracts.proto.v1 import relay_pb2, relay_pb2_grpc
from relayrl.runtime.grpc_util import channel, make_server
from relayrl_torch.weights import WeightError, build_manifest
from relayrl_torch.weights.client import RelayClient
from relayrl_torch.weights.wire import decode_bytes_chunk
from tests.conftest import free_ports

CHUNK = 4096


@pytest.fixture
def tree():
    """root <- mid <- leaf, each a real gRPC relay; mid and leaf follow their parent."""
    stop = threading.Event()
    servers, addresses, stores, followers = [], [], [], []
    for i in range(3):
        store = VersionStore(2, wait_timeout_s=10)
        (port,) = free_ports(1)
        address = f"127.0.0.1:{port}"
        upstream = addresses[-1:] if i else []  # as relay_svc.server.serve wires it
        server, _ = make_server(address, [(add_relay_servicer, RelayServicer(
            store, CHUNK, stall_timeout_s=10, upstream=upstream))])
        server.start()
        if i:
            follower = Follower(store, [addresses[-1]], CHUNK, poll_s=0.01, timeout_s=10)
            threading.Thread(target=follower.run, args=(stop,), daemon=True).start()
            followers.append(follower)
        servers.append(server)
        addresses.append(address)
        stores.append(store)
    yield addresses, stores, followers
    stop.set()
    for s in servers:
        s.stop(0)


def weights(seed: int, n: int = 64 * 1024) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(n, generator=g), "b": torch.randn(n // 2, generator=g)}


def wait_for(store: VersionStore, version: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while version not in store.versions():
        assert time.monotonic() < deadline, f"version {version} never arrived"
        time.sleep(0.01)


def chunks_of(manifest, tensors):
    yield relay_pb2.PublishMessage(manifest=manifest.to_proto())
    for name, t in tensors.items():
        data = t.view(-1).view(torch.uint8).numpy().tobytes()
        for off in range(0, len(data), CHUNK):
            yield relay_pb2.PublishMessage(chunk=relay_pb2.ShardChunk(
                shard=name, offset=off, data=data[off:off + CHUNK]))


def test_a_version_reaches_the_leaf_identical(tree):
    addresses, stores, _ = tree
    w = weights(1)
    RelayClient(addresses[0]).publish(1, 7, w)
    leaf = RelayClient(addresses[2], timeout_s=10)
    wait_for(stores[2], 1)
    pulled = leaf.pull(1)
    assert leaf.manifest(1).step == 7
    for name, t in w.items():
        assert torch.equal(pulled[name], t)


def test_the_leaf_serves_bytes_before_the_root_has_them_all(tree):
    addresses, stores, _ = tree
    w = weights(2)
    manifest = build_manifest(1, 1, w)
    messages = list(chunks_of(manifest, w))
    half = len(messages) // 2
    release = threading.Event()

    def publish():
        def stream():
            yield from messages[:half]
            release.wait(10)
            yield from messages[half:]
        relay_pb2_grpc.RelayStub(channel(addresses[0])).Publish(stream(), timeout=20)

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        deadline = time.monotonic() + 10
        while stores[2].pending_version() != 1:  # the announcement travels two hops
            assert time.monotonic() < deadline
            time.sleep(0.01)
        pull = channel(addresses[2]).unary_stream(
            "/relayrl.v1.Relay/PullBytes",
            request_serializer=relay_pb2.PullBytesRequest.SerializeToString,
            response_deserializer=decode_bytes_chunk)
        stream = pull(relay_pb2.PullBytesRequest(version=1), timeout=20)
        first = next(stream)  # arrives through two hops while the root is still pending
        assert len(first) > 0
        assert stores[0].pending_version() == 1 and stores[2].pending_version() == 1
        assert stores[2].versions() == []
    finally:
        release.set()
        publisher.join()
    received = len(first) + sum(len(p) for p in stream)
    wait_for(stores[2], 1)
    assert received == stores[2].get(1).size
    assert stores[2].versions() == [1]


def test_a_version_that_fails_upstream_never_completes_downstream(tree):
    addresses, stores, followers = tree
    good = weights(3)
    manifest = build_manifest(1, 1, good)
    bad = {k: v + 1 for k, v in good.items()}  # right sizes, wrong checksums
    with pytest.raises(grpc.RpcError) as info:
        relay_pb2_grpc.RelayStub(channel(addresses[0])).Publish(
            chunks_of(manifest, bad), timeout=10)
    assert "checksum mismatch" in info.value.details()
    assert stores[0].versions() == []
    RelayClient(addresses[0]).publish(2, 2, good)  # the tree recovers with the next version
    wait_for(stores[2], 2)
    for store in stores:
        assert store.versions() == [2]
    assert torch.equal(RelayClient(addresses[2]).pull(2)["a"], good["a"])


def test_a_follower_refuses_a_publish_and_copies_any_gap_its_upstream_has(tree):
    """A follower's versions come from upstream alone: a publish to it would fork them. It
    copies the newest upstream version, however far past its own (the root's rule bounds
    what the trainer may publish)."""
    addresses, stores, _ = tree
    leaf, root = RelayClient(addresses[2], timeout_s=10), RelayClient(addresses[0], timeout_s=10)
    with pytest.raises(WeightError, match="follows .* publish to the root relay"):
        leaf.publish(1, 1, weights(1))
    assert stores[2].versions() == []
    root.publish(1, 1, weights(1))
    wait_for(stores[2], 1)
    root.publish(1000, 2, weights(2))
    wait_for(stores[2], 1000)
    leaf.close()
    root.close()
