"""The asynchronous publisher: snapshots are taken before the weights change, sends never
block training, and a version that could not be sent in time gives way to a newer one."""

import threading

import pytest
import torch

from relay_svc.version_store import VersionStore
from trainer_svc.publisher import AsyncPublisher


class GatedStore(VersionStore):
    """A relay whose publishes wait for the test to open the gate."""

    def __init__(self):
        super().__init__(keep_versions=8)
        self.gate = threading.Event()
        self.started = threading.Event()

    def publish(self, version, step, tensors):
        self.started.set()
        assert self.gate.wait(10)
        return super().publish(version, step, tensors)


def test_the_snapshot_is_the_state_at_publish_time():
    store = VersionStore(4)
    pub = AsyncPublisher(store)
    w = {"w": torch.zeros(1000)}
    pub.publish(1, 1, w)
    pub.fence()
    w["w"].add_(5.0)  # the optimizer step that follows the fence
    pub.wait()
    assert torch.equal(store.pull(1)["w"], torch.zeros(1000))
    pub.close()


def test_a_slow_relay_never_blocks_training_and_the_newest_version_wins():
    store = GatedStore()
    pub = AsyncPublisher(store)
    w = {"w": torch.zeros(10)}
    pub.publish(1, 1, w)
    assert store.started.wait(10)  # version 1 is stuck in the send
    for v in (2, 3, 4):
        pub.fence()
        w["w"].fill_(float(v - 1))
        pub.publish(v, v, w)  # returns although the relay is blocked
    pub.fence()
    store.gate.set()
    pub.wait()
    assert store.versions() == [1, 4]
    assert torch.equal(store.pull(4)["w"], torch.full((10,), 3.0))
    assert pub.versions_published == 2 and pub.versions_skipped == 2
    pub.close()


def test_a_failed_send_is_counted_and_the_next_version_goes_through():
    store = VersionStore(4)
    pub = AsyncPublisher(store)
    pub.publish(2, 2, {"w": torch.ones(3)})
    pub.wait()
    pub.publish(1, 1, {"w": torch.ones(3)})  # not newer: the relay refuses it
    pub.wait()
    assert pub.failures == 1
    pub.publish(3, 3, {"w": torch.ones(3)})
    pub.wait()
    assert store.versions() == [2, 3] and pub.published_version == 3
    pub.close()


class StagingStore(GatedStore):
    """A gated relay that takes versions staged into files in `directory`, as a relay on
    the trainer's host takes them from shared memory."""

    def __init__(self, directory):
        super().__init__()
        self.directory = str(directory)

    def stage(self, version, step, tensors, dtype=None):
        from relayrl_torch.weights.shm_handoff import StagedVersion

        return StagedVersion.write(self.directory, version, step, tensors, dtype)

    def send_staged(self, staged):
        return self.publish(staged.version, staged.step, staged.tensors())


def test_staged_versions_replace_the_snapshot_and_are_let_go_once_sent_or_replaced(tmp_path):
    """Weights on the CPU are written straight into the plane's file: no snapshot buffer is
    filled, the newest version still wins while the relay is slow, and no file is left once
    the publisher closes."""
    store = StagingStore(tmp_path)
    pub = AsyncPublisher(store, dtype=torch.bfloat16)
    w = {"w": torch.zeros(10), "steps": torch.tensor([0])}
    pub.publish(1, 1, w)
    assert store.started.wait(10)
    for v in (2, 3, 4):
        pub.fence()
        w["w"].fill_(float(v - 1))
        pub.publish(v, v, w)
    pub.fence()
    store.gate.set()
    pub.wait()
    assert store.versions() == [1, 4] and pub.versions_skipped == 2
    pulled = store.pull(4)
    assert pulled["w"].dtype == torch.bfloat16 and torch.equal(pulled["w"].float(), w["w"])
    assert pulled["steps"].dtype == torch.int64  # only floating-point weights are cast
    assert all(not s.buffers for s in pub._sets)
    held = pub.shipped(4)
    assert held is not None and pub.shipped(3) is None
    assert torch.equal(held.tensors()["w"].float(), w["w"])
    held.release()
    pub.close()
    assert sorted(tmp_path.iterdir()) == []


def test_a_staged_version_that_is_not_finite_is_never_sent_nor_kept(tmp_path):
    from trainer_svc.finite import NonFiniteError

    store = StagingStore(tmp_path)
    store.gate.set()
    pub = AsyncPublisher(store)
    pub.publish(1, 1, {"w": torch.tensor([1.0, float("nan")])})
    pub.fence()
    with pytest.raises(NonFiniteError, match="publish version 1"):
        pub.wait()
    assert store.versions() == [] and pub.shipped(1) is None
    assert sorted(tmp_path.iterdir()) == []  # its file is gone with it
    with pytest.raises(NonFiniteError):
        pub.close()
