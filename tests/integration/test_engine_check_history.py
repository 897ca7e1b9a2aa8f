"""The engine check re-scores older tokens under the version that sampled them, including a
version published by a step that trained on nothing (all its groups stale): that version's
weights are its predecessor's, and the trainer must still hold them."""

import threading

import pytest
import torch

from relay_svc.version_store import VersionStore
from relayrl.config import RunConfig
from relayrl.keys import RunKeys
from relayrl.messages import Batch, Group, Sample, encode_batch
from relayrl.metrics import read_metrics
from relayrl.models.loading import load_model
from relayrl.redis_conn import EmbeddedRedis, connect
from relayrl.streams import FIELD
from trainer_svc.publisher import AsyncPublisher
from trainer_svc.server import run_loop
from trainer_svc.trainer import Trainer

GROUP, RESPONSE = 2, 3
# the version that sampled each step's batch; at step 3 (trainer version 2) version 0 is two
# behind, past max_staleness 1, so step 3 trains on nothing and publishes version 2's weights
SAMPLED_BY = [0, 1, 0, 2]


@pytest.fixture
def run(tmp_path, tiny_lm):
    server = EmbeddedRedis(tmp_path)
    cfg = RunConfig.model_validate({
        "run_id": "echeck", "run_dir": str(tmp_path / "run"), "redis": {"url": server.url},
        "task": {"digits": 1, "eval_size": 4},
        "rollout": {"samples_per_prompt": GROUP, "max_new_tokens": RESPONSE},
        "buffer": {"group_size": GROUP, "groups_per_batch": 1},
        "trainer": {"max_steps": len(SAMPLED_BY), "max_staleness": 1, "progress": False,
                    "plot_every": 100, "checkpoint_every": 100, "engine_check_versions": 2,
                    "engine_check_seqs": 4},
        "eval": {"every": 100},
    })
    r = connect(server.url)
    torch.manual_seed(0)
    t = Trainer(cfg, load_model(tiny_lm.path), r, AsyncPublisher(VersionStore(8)))
    for step, version in enumerate(SAMPLED_BY):
        group = Group(step, [
            Sample(prompt_id=step, lease_id=f"L{step}", worker_id="w",
                   prompt_tokens=t.lm.encode_prompt(f"{step}+1="),
                   response_tokens=[5 + k] * (RESPONSE - 1) + [t.lm.eos_id],
                   logprobs=[-1.0] * RESPONSE, versions=[version] * RESPONSE, reward=float(k))
            for k in range(GROUP)])
        r.xadd(RunKeys(cfg.run_id).batches, {FIELD: encode_batch(Batch(f"b{step}", [group]))})
    yield t
    t.publisher.close()
    server.shutdown()


def test_a_version_published_without_an_update_is_still_rescored(run):
    run_loop(run, threading.Event())
    rows = {r["step"]: r for r in read_metrics(run.metrics.path) if r["step"] > 0}
    assert rows[3]["train/groups_dropped_stale"] == 1 and "train/loss" not in rows[3]
    # step 4 trains at version 3 on version 2's tokens: re-scored, so all of them are checked
    assert rows[4]["rollout/engine_tokens_frac"] == 1.0
    assert rows[2]["rollout/engine_tokens_frac"] == 1.0  # version 1's, at version 1
