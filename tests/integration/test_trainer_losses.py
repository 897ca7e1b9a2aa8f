"""The trainer runs every loss on batches from its Redis stream: one step each, finite and
moving the weights; DAPO's filtered groups are finished in the ledger (dropped, counted),
never lost; PPO's value head survives a restart."""

import math
import threading

import pytest
import torch

from relay_svc.version_store import VersionStore
from relayrl.config import RunConfig
from relayrl.contracts import ledger
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.messages import Batch, Group, Sample, encode_batch
from relayrl.contracts.streams import FIELD
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from relayrl_torch.models.loading import load_model
from trainer_svc.loop import Trainer
from trainer_svc.losses import LOSSES
from trainer_svc.publisher import AsyncPublisher
from trainer_svc.record import step_record


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    yield server.url
    server.shutdown()


def config(tmp_path, url, loss, **loss_fields):
    return RunConfig.model_validate({
        "run_id": f"loss-{loss}", "run_dir": str(tmp_path / loss), "redis": {"url": url},
        "task": {"digits": 1, "eval_size": 4},
        "rollout": {"max_new_tokens": 3},
        "buffer": {"group_size": 2, "groups_per_batch": 2},
        "trainer": {"loss": {"name": loss, "kl_coef": 0.05, "entropy_coef": 0.01, **loss_fields},
                    "max_staleness": 100, "optimizer": {"lr": 1e-2}, "progress": False,
                    "engine_check_seqs": 0},
    })


def push_batch(r, cfg, lm, varied_pid: int, uniform_pid: int) -> None:
    groups = []
    for pid, rewards in ((varied_pid, (1.0, 0.0)), (uniform_pid, (1.0, 1.0))):
        prompt = lm.encode_prompt(f"{pid % 10}+1=")
        groups.append(Group(pid, [
            Sample(prompt_id=pid, lease_id=f"L{pid}", worker_id="w", prompt_tokens=prompt,
                   response_tokens=[5 + k, lm.eos_id], logprobs=[-1.0, -0.5], versions=[0, 0],
                   reward=reward)
            for k, reward in enumerate(rewards)]))
    r.xadd(RunKeys(cfg.run_id).batches, {FIELD: encode_batch(Batch(f"b{varied_pid}", groups))})


def new_trainer(cfg, r, model_path):
    torch.manual_seed(0)
    return Trainer(cfg.trainer_part(), load_model(model_path), r, AsyncPublisher(VersionStore(16)))


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_the_trainer_steps_every_loss(tmp_path, redis_url, tiny_lm, loss):
    r = connect(redis_url)
    cfg = config(tmp_path, redis_url, loss)
    trainer = new_trainer(cfg, r, tiny_lm.path)
    push_batch(r, cfg, trainer.lm, varied_pid=10, uniform_pid=11)
    before = {k: v.clone() for k, v in trainer.lm.model.state_dict().items()}

    record = step_record(trainer.train_step(*trainer.next_batch(threading.Event()))).to_json()
    trainer.save_checkpoint()
    trainer.publisher.close()

    assert all(math.isfinite(v) for v in record.values() if isinstance(v, float)), record
    assert "train/kl_ref" in record and "train/entropy" in record
    after = trainer.lm.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    keys = RunKeys(cfg.run_id)
    consumed = ledger.members(r, keys, "consumed")
    dropped = ledger.members(r, keys, "dropped")
    if loss == "dapo":  # dynamic sampling: the group whose rewards agree is not trained on
        assert record["train/groups_filtered_uniform"] == 1
        assert record["train/groups"] == 1 and record["train/samples"] == 2
        assert (consumed, dropped) == ({10}, {11})
        assert record["train/groups_uniform_frac"] == 0.5  # before the filter
        assert trainer.totals["groups_filtered_uniform"] == 1
        assert trainer.totals["samples_filtered_uniform"] == 2
    else:
        assert record["train/groups_filtered_uniform"] == 0
        assert record["train/groups_uniform_frac"] == 0.5  # one varied, one uniform group
        assert (consumed, dropped) == ({10, 11}, set())
    assert trainer.totals["scheduler_prompts_finished"] == 2


def test_the_value_head_survives_a_restart(tmp_path, redis_url, tiny_lm):
    r = connect(redis_url)
    cfg = config(tmp_path, redis_url, "ppo", kl_coef=0.0)
    first = new_trainer(cfg, r, tiny_lm.path)
    push_batch(r, cfg, first.lm, varied_pid=20, uniform_pid=21)
    first.train_step(*first.next_batch(threading.Event()))
    first.save_checkpoint()
    first.publisher.close()
    head = {k: v.clone() for k, v in first.objective.value_head.state_dict().items()}
    assert any(v.abs().sum() > 0 for v in head.values())  # it trained away from zero

    second = new_trainer(cfg, r, tiny_lm.path)
    second.resume()
    for k, v in second.objective.value_head.state_dict().items():
        assert torch.equal(v, head[k])
    push_batch(r, cfg, second.lm, varied_pid=22, uniform_pid=23)
    record = step_record(second.train_step(*second.next_batch(threading.Event()))).to_json()
    second.publisher.close()
    assert math.isfinite(record["train/value_loss"])
