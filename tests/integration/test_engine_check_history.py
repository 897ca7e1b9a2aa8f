"""The engine check re-scores older tokens under the version that sampled them, including a
version published by a step that trained on nothing (all its groups stale): that version's
weights are its predecessor's, and the trainer must still hold them."""

import threading

import pytest

from relayrl.runtime.metrics import read_metrics
from tests.integration.test_trainer_metrics import add_batch, in_process_trainer
from trainer_svc.server import run_loop

# the version that sampled each step's batch; at step 3 (trainer version 2) version 0 is two
# behind, past max_staleness 1, so step 3 trains on nothing and publishes version 2's weights
SAMPLED_BY = [0, 1, 0, 2]


@pytest.fixture
def trainer(tmp_path, tiny_lm):
    t, server = in_process_trainer(
        tmp_path, tiny_lm.path, "echeck", 1,
        {"max_steps": len(SAMPLED_BY), "max_staleness": 1, "plot_every": 100,
         "engine_check_versions": 2, "engine_check_seqs": 4},
        eval_every=100)
    for step, version in enumerate(SAMPLED_BY):
        add_batch(t, f"b{step}", [step], version)
    yield t
    t.publisher.close()
    server.shutdown()


def test_a_version_published_without_an_update_is_still_rescored(trainer):
    run_loop(trainer, threading.Event())
    rows = {r["step"]: r for r in read_metrics(trainer.metrics.path) if r["step"] > 0}
    assert rows[3]["train/groups_dropped_stale"] == 1 and "train/loss" not in rows[3]
    # step 4 trains at version 3 on version 2's tokens: re-scored, so all of them are checked
    assert rows[4]["rollout/engine_tokens_frac"] == 1.0
    assert rows[2]["rollout/engine_tokens_frac"] == 1.0  # version 1's, at version 1
