"""The engine check re-scores older tokens under the version that sampled them, including a
version published by a step that trained on nothing (all its groups stale): that version's
weights are its predecessor's, and the trainer must still hold them. Published through
shared memory, the versions are re-scored from their files, with the same figures."""

import threading

import pytest

from relayrl.runtime.metrics import read_metrics
from relayrl_torch.weights.client import RelayClient
from tests.integration.test_trainer_metrics import add_batch, in_process_trainer
from tests.integration.test_weight_plane import start_relay

# the version that sampled each step's batch; at step 3 (trainer version 2) version 0 is two
# behind, past max_staleness 1, so step 3 trains on nothing and publishes version 2's weights
SAMPLED_BY = [0, 1, 0, 2]


def run(tmp_path, model_path, plane=None) -> tuple[dict[int, dict], int]:
    """The metrics rows of a run by step, and how many versions the trainer held as
    copies of its own at the end."""
    t, server = in_process_trainer(
        tmp_path, model_path, "echeck", 1,
        {"max_steps": len(SAMPLED_BY), "max_staleness": 1, "plot_every": 100,
         "engine_check_versions": 2, "engine_check_seqs": 4},
        eval_every=100, plane=plane)
    for step, version in enumerate(SAMPLED_BY):
        add_batch(t, f"b{step}", [step], version)
    try:
        t.run(threading.Event())
        copies = t.history.copies
    finally:
        t.history.close()
        t.publisher.close()
        server.shutdown()
    return {r["step"]: r for r in read_metrics(t.metrics.path) if r["step"] > 0}, copies


def test_a_version_published_without_an_update_is_still_rescored(tmp_path, tiny_lm):
    rows, copies = run(tmp_path, tiny_lm.path)
    assert rows[3]["train/groups_dropped_stale"] == 1 and "train/loss" not in rows[3]
    # step 4 trains at version 3 on version 2's tokens: re-scored, so all of them are checked
    assert rows[4]["rollout/engine_tokens_frac"] == 1.0
    assert rows[2]["rollout/engine_tokens_frac"] == 1.0  # version 1's, at version 1
    assert copies == 2


def test_versions_published_through_shared_memory_are_rescored_from_their_files(tmp_path,
                                                                                   tiny_lm):
    copied, _ = run(tmp_path / "copies", tiny_lm.path)
    address, store, stop = start_relay(tmp_path, ["grpc", "shm"])
    try:
        client = RelayClient(address, timeout_s=10, publish_shm_dir=store.shm_dir)
        rows, copies = run(tmp_path / "shm", tiny_lm.path, client)
        assert store.versions()[-1] == len(SAMPLED_BY)
    finally:
        stop()
    assert copies == 0
    for step in (2, 4):
        assert rows[step]["rollout/engine_tokens_frac"] == 1.0
        assert rows[step]["rollout/engine_logp_absdiff"] == pytest.approx(
            copied[step]["rollout/engine_logp_absdiff"], abs=1e-6)
