"""A worker pulling over the shm plane loads what it verified: the version's bytes are its
own once checked, so the relay recycling the file of a version it drops, for a later
version's bytes, changes nothing the worker holds."""

import os

import pytest
import torch

from relayrl_torch.weights.client import RelayClient
from tests.integration.test_weight_plane import KEEP, start_relay, weights


@pytest.fixture
def relay(tmp_path):
    address, store, stop = start_relay(tmp_path, ["grpc", "shm"])
    yield address, store
    stop()


def test_a_version_dropped_after_its_pull_leaves_the_pulled_tensors_as_verified(relay):
    address, store = relay
    trainer = RelayClient(address, timeout_s=10, plane="shm", publish_shm_dir=store.shm_dir)
    worker = RelayClient(address, timeout_s=10, plane="shm")
    trainer.publish(1, 1, weights(1))
    inode = os.stat(store.get(1).shm_path).st_ino
    pulled = worker.pull(1)  # verified; the engine has yet to copy the tensors in

    # the relay lets version 1 go and writes a later version into its file
    for v in range(2, KEEP + 3):
        trainer.publish(v, v, weights(v))
    assert inode in {os.stat(store.get(v).shm_path).st_ino for v in store.versions()}

    for name, tensor in weights(1).items():
        assert torch.equal(pulled[name], tensor), name
