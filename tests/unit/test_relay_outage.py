"""A relay that is away is waited out, on both sides: the trainer's publisher keeps the newest
version and sends it once the relay is back (never blocking training), a worker keeps
generating on the weights it has and asks again with backoff; each reports itself unready
meanwhile. A real relay server is started late on a port the clients already use."""

import logging
import threading
import time

import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from relay_svc.server import RelayServicer, add_relay_servicer
from relay_svc.version_store import VersionStore
from relayrl.runtime.grpc_util import channel, check_health, free_ports, make_server
from relayrl.runtime.outage import JitteredBackoff, Outage, Readiness, is_outage, readiness
from relayrl.runtime.service import LIVENESS, ServiceRunner
from relayrl_torch.models.loading import load_model
from relayrl_torch.weights import WeightError
from relayrl_torch.weights.client import RelayClient
from relayrl_torch.weights.manifest import build_manifest
from rollout_svc.engines.torch import TorchEngine
from rollout_svc.weight_refresh import WeightRefresher
from trainer_svc.publisher import AsyncPublisher


def until(cond, what: str, timeout_s: float = 60.0) -> None:
    """Poll `cond`; the timeout only stops a broken build from hanging the suite."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"not reached: {what}"
        time.sleep(0.01)


class LateRelay:
    """A relay's address, answered by nobody until `start`."""

    def __init__(self):
        self.address = f"127.0.0.1:{free_ports(1)[0]}"
        self.store = VersionStore(4)
        self.server = None

    def start(self) -> None:
        self.server, _ = make_server(self.address,
                                     [(add_relay_servicer, RelayServicer(self.store, 4096))])
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0)


@pytest.fixture
def relay():
    late = LateRelay()
    yield late
    late.stop()


def quick_outage(board: Readiness) -> Outage:
    return Outage("relay", JitteredBackoff(0.01, 0.05), board)


def weights(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((64,), value)}


def test_a_relay_call_that_cannot_connect_is_an_outage_a_refusal_is_not(relay):
    client = RelayClient(relay.address, timeout_s=5)
    with pytest.raises(WeightError) as away:
        client.manifest(0)
    assert is_outage(away.value)
    client.close()
    relay.start()
    client = RelayClient(relay.address, timeout_s=5)
    client.publish(1, 1, weights(1.0))
    with pytest.raises(WeightError) as refused:  # the relay answered, and said no
        client.publish(1, 1, weights(2.0))
    assert not is_outage(refused.value)
    client.close()


def test_the_final_version_waits_for_the_relay_and_a_newer_one_replaces_it(relay, caplog):
    caplog.set_level(logging.INFO)
    board = Readiness()
    pub = AsyncPublisher(RelayClient(relay.address, timeout_s=5), quick_outage(board))
    pub.publish(1, 1, weights(1.0))
    until(lambda: not board.ready, "the publisher to report the relay away")
    pub.fence()
    pub.publish(2, 2, weights(2.0))  # returns at once: training goes on
    pub.fence()
    relay.start()
    pub.wait()  # until the last version is at the relay
    assert relay.store.versions() == [2] and pub.published_version == 2
    assert torch.equal(relay.store.pull(2)["w"], weights(2.0)["w"])
    assert pub.versions_skipped == 1 and pub.failures >= 1
    assert board.ready
    assert caplog.text.count("relay unreachable") == 1 and "relay is back after" in caplog.text
    pub.close()


def test_told_to_stop_it_stops_waiting_for_the_relay_and_says_so(relay, caplog):
    board = Readiness()
    pub = AsyncPublisher(RelayClient(relay.address, timeout_s=5), quick_outage(board))
    pub.publish(3, 3, weights(3.0))
    until(lambda: not board.ready, "the publisher to report the relay away")
    stop = threading.Event()
    stop.set()
    with caplog.at_level(logging.ERROR):
        pub.wait(stop)
        pub.close()
    assert "stopping with version 3 not at the relay" in caplog.text
    assert board.ready and relay.store.versions() == []


def test_a_publish_the_relay_refuses_is_logged_and_not_sent_again(relay, caplog):
    relay.start()
    pub = AsyncPublisher(RelayClient(relay.address, timeout_s=5), quick_outage(Readiness()))
    pub.publish(1, 1, weights(1.0))
    pub.wait()
    pub.publish(5000, 5000, weights(2.0))  # past relay.max_version_gap: refused
    with caplog.at_level(logging.ERROR):
        pub.wait()
    assert pub.failures == 1 and relay.store.versions() == [1]
    assert "the relay refused version 5000" in caplog.text and "max_version_gap" in caplog.text
    pub.close()


def test_a_retry_replaces_the_first_stream_of_a_stalled_publish():
    store = VersionStore(4)
    store.publish(1, 1, weights(1.0))
    data = weights(2.0)["w"].numpy().tobytes()
    manifest = build_manifest(2, 2, weights(2.0))
    first = store.begin(manifest)  # its publisher's deadline passed while the relay stalled
    first.write_shard("w", 0, data)
    retry = store.begin(manifest)  # before the relay saw the first stream end
    with pytest.raises(WeightError, match="failed"):  # the first stream, going on
        store.commit(first)
    retry.write_shard("w", 0, data)
    store.commit(retry)
    assert store.versions() == [1, 2] and torch.equal(store.pull(2)["w"], weights(2.0)["w"])
    store.begin(build_manifest(3, 3, weights(3.0)))
    with pytest.raises(WeightError, match="not newer"):  # other weights are still refused
        store.begin(build_manifest(3, 3, weights(9.0)))


def test_a_worker_keeps_its_weights_while_no_relay_answers_and_asks_with_backoff(tiny_lm,
                                                                                 relay):
    board = Readiness()
    slow = Outage("relay", JitteredBackoff(600.0, 600.0, draw=lambda: 1.0), board)
    refresher = WeightRefresher(TorchEngine(load_model(tiny_lm.path)),
                                [RelayClient(relay.address, timeout_s=5)], slow)
    assert not refresher.refresh()
    assert not board.ready and refresher.pull_failures == 1
    assert not refresher.refresh()  # before the backoff's next try: the relay is not asked
    assert refresher.pull_failures == 1 and refresher.engine.version == 0


def test_a_worker_is_ready_again_and_moves_on_once_the_relay_is_back(tiny_lm, relay, caplog):
    caplog.set_level(logging.INFO)
    lm = load_model(tiny_lm.path)
    board = Readiness()
    eager = Outage("relay", JitteredBackoff(0.01, 0.01, draw=lambda: 0.0), board)
    refresher = WeightRefresher(TorchEngine(lm), [RelayClient(relay.address, timeout_s=5)],
                                eager)
    assert not refresher.refresh() and not board.ready
    relay.start()
    relay.store.publish(1, 1, {k: v + 0.01 for k, v in lm.model.state_dict().items()})
    until(refresher.refresh, "the worker to load version 1")
    assert refresher.engine.version == 1 and board.ready
    assert caplog.text.count("relay unreachable") == 1 and "relay is back after" in caplog.text


def test_a_relay_that_did_not_answer_is_asked_after_the_others_until_its_backoff_passes(
        tiny_lm, monkeypatch):
    """A worker's first relay gone (its host cut off): the next pulls go to the root without
    asking it first, and once its backoff has passed and it is back it leads again."""
    from rollout_svc import weight_refresh

    monkeypatch.setattr(weight_refresh, "AWAY_FIRST_S", 0.2)
    lm = load_model(tiny_lm.path)
    child, root = LateRelay(), LateRelay()
    root.start()
    try:
        eager = Outage("relay", JitteredBackoff(0.01, 0.01, draw=lambda: 0.0), Readiness())
        refresher = WeightRefresher(TorchEngine(lm), [RelayClient(child.address, timeout_s=5),
                                                      RelayClient(root.address, timeout_s=5)],
                                    eager)
        state = lm.model.state_dict()
        root.store.publish(1, 1, {k: v + 0.01 for k, v in state.items()})
        assert refresher.refresh() and refresher.engine.version == 1
        assert refresher.pull_failures == 1 and refresher.relays_put_behind == 1
        root.store.publish(2, 2, {k: v + 0.02 for k, v in state.items()})
        assert refresher.refresh() and refresher.engine.version == 2
        assert refresher.pull_failures == 1  # the child was not asked
        child.start()
        child.store.publish(3, 3, {k: v + 0.03 for k, v in state.items()})
        until(refresher.refresh, "the worker to load version 3 from the child")
        assert refresher.engine.version == 3
        failures = refresher.pull_failures
        root.store.publish(4, 4, {k: v + 0.04 for k, v in state.items()})
        assert not refresher.refresh()  # the child leads again, and holds nothing newer
        assert refresher.pull_failures == failures and refresher.engine.version == 3
    finally:
        child.stop()
        root.stop()


def test_a_service_waiting_for_a_peer_is_unready_but_alive():
    address = f"127.0.0.1:{free_ports(1)[0]}"
    runner = ServiceRunner("probe", address, [])
    health = health_pb2_grpc.HealthStub(channel(address))

    def probes() -> tuple[bool, bool]:  # (ready, alive), as k8s asks them
        alive = health.Check(health_pb2.HealthCheckRequest(service=LIVENESS), timeout=10)
        return check_health(address, 10), alive.status == health_pb2.HealthCheckResponse.SERVING

    seen = []

    def loop(stop):
        readiness.enter("relay")
        try:
            seen.append(probes())
        finally:
            readiness.leave("relay")
        seen.append(probes())

    runner.run(loop, grace_s=0)
    assert seen == [(False, True), (True, True)]
