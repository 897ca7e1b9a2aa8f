"""Publishing through shared memory (relayrl_torch.weights.shm_handoff, trainer.publish_plane shm)
beyond the shared contract (test_weight_plane.py runs that for it): the relay takes the
publisher's file over, refuses files that are not a handoff or do not match the manifest,
recycles the files of versions it lets go, and a relay that cannot take one gets the bytes
over gRPC."""

import logging
import os

import grpc
import pytest
import torch

from relayrl.config import RunConfig
from relayrl.contracts.proto.v1 import relay_pb2, relay_pb2_grpc
from relayrl.runtime.grpc_util import channel
from relayrl_torch.weights.client import RelayClient
from relayrl_torch.weights.hostid import host_id
from relayrl_torch.weights.manifest import build_manifest
from relayrl_torch.weights.shm_handoff import StagedVersion, handoff_name
from tests.integration.test_weight_plane import start_relay, weights


@pytest.fixture
def relay(tmp_path):
    address, store, stop = start_relay(tmp_path, ["grpc", "shm"])
    yield address, store
    stop()


def written(directory: str, tensors) -> str:
    """A handoff file of version 1 holding `tensors`, left for the test to hand over."""
    staged = StagedVersion.write(directory, 1, 1, tensors)
    os.link(staged.path, kept := staged.path + "k")
    staged.release()  # removes its name: the link keeps the file, unlocked
    os.rename(kept, staged.path)
    return staged.path


def publish_file(address: str, name: str, version: int, host: str | None = None):
    """Hand over `name` as `version` (of weights(version)) by hand: (status, details)."""
    stub = relay_pb2_grpc.RelayStub(channel(address))
    messages = [relay_pb2.PublishMessage(manifest=build_manifest(version, version,
                                                                 weights(version)).to_proto()),
                relay_pb2.PublishMessage(shm=relay_pb2.ShmHandoff(file_name=name,
                                                                  host_id=host or host_id()))]
    try:
        stub.Publish(iter(messages), timeout=10)
    except grpc.RpcError as err:
        return err.code(), err.details()
    return grpc.StatusCode.OK, ""


def test_the_relay_takes_the_file_over_and_serves_it(relay):
    address, store = relay
    client = RelayClient(address, timeout_s=10, plane="shm", publish_shm_dir=store.shm_dir)
    before = set(os.listdir(store.shm_dir))
    client.publish(1, 1, weights(1))
    stored = store.get(1)
    new = set(os.listdir(store.shm_dir)) - before
    assert new == {os.path.basename(stored.shm_path)}  # renamed: no handoff name is left
    assert not any("-pub" in name for name in new)
    for pull in (client, RelayClient(address, timeout_s=10)):  # shm and gRPC alike
        pulled = pull.pull(1)
        assert all(torch.equal(pulled[k], t) for k, t in weights(1).items())
    for v in (2, 3):  # keep 2: version 1's file goes with it
        client.publish(v, v, weights(v))
    assert not os.path.exists(stored.shm_path)
    assert client.publish_shm_dir == store.shm_dir  # no fallback happened


def test_a_let_go_version_s_file_is_the_next_version_s_and_none_outlives_the_relay(relay):
    """Recycling (relayrl_torch.weights.shm_handoff): version 1's file, let go when version 3
    arrives (keep 2), holds version 4; closing the relay removes its spares."""
    address, store = relay
    client = RelayClient(address, timeout_s=10, plane="shm", publish_shm_dir=store.shm_dir)
    client.publish(1, 1, weights(1))
    inode = os.stat(store.get(1).shm_path).st_ino
    for v in (2, 3):
        client.publish(v, v, weights(v))
    spares = [n for n in os.listdir(store.shm_dir) if "-spare" in n]
    assert [os.stat(os.path.join(store.shm_dir, n)).st_ino for n in spares] == [inode]
    client.publish(4, 4, weights(4))
    assert os.stat(store.get(4).shm_path).st_ino == inode
    pulled = client.pull(4)
    assert all(torch.equal(pulled[k], t) for k, t in weights(4).items())
    store.close()
    assert not [n for n in os.listdir(store.shm_dir) if n.startswith(f"relayrl-{os.getpid()}")]


def test_a_file_whose_bytes_do_not_match_the_manifest_is_refused_and_removed(relay):
    address, store = relay
    path = written(store.shm_dir, weights(2))
    before = set(os.listdir(store.shm_dir))
    code, details = publish_file(address, os.path.basename(path), 1)  # weights(1)'s manifest
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "checksum mismatch" in details
    assert store.versions() == [] and store.stats.failed_publishes == 1
    assert set(os.listdir(store.shm_dir)) == before - {os.path.basename(path)}


def test_names_sizes_and_links_that_are_not_a_handoff_are_refused(relay, tmp_path):
    address, store = relay
    for bad in ("../etc/passwd", "relayrl-1-v1-0123abcd", "x" * 300):
        code, details = publish_file(address, bad, 1)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "not a handoff name" in details
    short = os.path.join(store.shm_dir, handoff_name(1))
    with open(short, "wb") as f:
        f.write(b"\0" * 10)
    code, details = publish_file(address, os.path.basename(short), 1)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "holds 10 bytes" in details
    os.unlink(short)
    target = written(str(tmp_path), weights(1))
    link = os.path.join(store.shm_dir, handoff_name(1))
    os.symlink(target, link)
    try:
        code, details = publish_file(address, os.path.basename(link), 1)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "cannot open" in details
    finally:
        os.unlink(link)
    assert store.versions() == []


def test_a_handoff_from_another_host_or_a_missing_file_is_a_precondition(relay):
    address, store = relay
    path = written(store.shm_dir, weights(1))
    try:
        code, details = publish_file(address, os.path.basename(path), 1, host="elsewhere/1")
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "not on this relay's host" in details
    finally:
        os.unlink(path)
    code, details = publish_file(address, handoff_name(1), 1)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "No such file" in details


def test_a_relay_that_takes_no_handoff_gets_the_bytes_over_grpc(tmp_path, caplog):
    from relay_svc.server import RelayServicer, add_relay_servicer
    from relay_svc.version_store import VersionStore
    from relayrl.runtime.grpc_util import free_ports, make_server

    store = VersionStore(2)  # no shm_dir: versions in process memory
    address = f"127.0.0.1:{free_ports(1)[0]}"
    server, _ = make_server(address, [(add_relay_servicer, RelayServicer(store, 1024))])
    server.start()
    try:
        client = RelayClient(address, timeout_s=10, publish_shm_dir=str(tmp_path))
        with caplog.at_level(logging.WARNING):
            client.publish(1, 1, weights(1))
        assert "publishing over gRPC from now on" in caplog.text
        assert client.publish_shm_dir is None and os.listdir(tmp_path) == []
        client.publish(2, 2, weights(2))
        assert store.versions() == [1, 2]
        assert torch.equal(client.pull(2)["embed"], weights(2)["embed"])
    finally:
        server.stop(0)
        store.close()


def test_a_publisher_that_cannot_write_the_file_sends_the_bytes_over_grpc(relay, tmp_path,
                                                                          caplog):
    address, store = relay
    client = RelayClient(address, timeout_s=10, publish_shm_dir=str(tmp_path / "missing"))
    with caplog.at_level(logging.WARNING):
        client.publish(1, 1, weights(1))
    assert "no handoff file can be written" in caplog.text and client.publish_shm_dir is None
    assert store.versions() == [1]


def test_nothing_may_follow_a_handoff(relay):
    address, store = relay
    manifest = build_manifest(1, 1, weights(1))
    path = written(store.shm_dir, weights(1))
    stub = relay_pb2_grpc.RelayStub(channel(address))
    messages = [relay_pb2.PublishMessage(manifest=manifest.to_proto()),
                relay_pb2.PublishMessage(shm=relay_pb2.ShmHandoff(
                    file_name=os.path.basename(path), host_id=host_id())),
                relay_pb2.PublishMessage(chunk=relay_pb2.ShardChunk(shard="embed", data=b"x"))]
    with pytest.raises(grpc.RpcError) as err:
        stub.Publish(iter(messages), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "one shm handoff alone" in err.value.details()
    assert store.versions() == [] and not os.path.exists(path)


def test_the_shm_publish_plane_is_a_configuration_choice():
    """Refused without the relay's shm plane: tests/unit/test_config.py's cross-checks."""
    cfg = RunConfig(relay={"data_planes": ["grpc", "shm"], "shm_dir": "/dev/shm"},
                    trainer={"publish_plane": "shm"})
    assert cfg.trainer.publish_plane == "shm"


def test_a_file_its_publisher_still_holds_is_removed_not_recycled(relay):
    """A trainer re-scoring under a version it published keeps that version's file mapped
    (relayrl_torch.weights.shm_handoff.StagedVersion): when the relay lets the version go, the
    file is removed rather than recycled, so the held bytes stay that version's."""
    address, store = relay
    client = RelayClient(address, timeout_s=10, plane="shm", publish_shm_dir=store.shm_dir)
    held = client.stage(1, 1, weights(1))
    client.send_staged(held)
    inode = os.stat(store.get(1).shm_path).st_ino
    for v in (2, 3, 4):  # keep 2: version 1 is let go, and later versions need files
        client.publish(v, v, weights(v))
    spares = [os.stat(os.path.join(store.shm_dir, n)).st_ino
              for n in os.listdir(store.shm_dir) if "-spare" in n]
    assert inode not in spares
    assert all(os.stat(store.get(v).shm_path).st_ino != inode for v in (3, 4))
    assert all(torch.equal(held.tensors()[k], t) for k, t in weights(1).items())
    held.release()


def test_a_staged_file_gone_before_its_retry_is_sent_over_grpc_once(relay, caplog):
    """A relay that took a version's file and lost it (restarted before answering) is sent
    that version's bytes over gRPC, read back from the mapping; later versions still go
    through shared memory."""
    address, store = relay
    client = RelayClient(address, timeout_s=10, publish_shm_dir=store.shm_dir)
    staged = client.stage(1, 1, weights(1))
    os.unlink(staged.path)  # the relay renamed it, then lost it
    with caplog.at_level(logging.WARNING):
        client.send_staged(staged)
    staged.release()
    assert "version 1 goes over gRPC" in caplog.text
    assert client.publish_shm_dir == store.shm_dir
    assert all(torch.equal(client.pull(1)[k], t) for k, t in weights(1).items())
    client.publish(2, 2, weights(2))
    assert store.versions() == [1, 2] and "from now on" not in caplog.text
