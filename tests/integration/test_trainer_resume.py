"""Kill the trainer between checkpoints: the restarted one resumes from the checkpoint,
re-reads exactly the batches it had not made durable, and ends with the same weights."""

import threading

import pytest
import torch

from relay_svc.version_store import VersionStore
from relayrl.config import RunConfig
from relayrl.contracts import ledger
from relayrl.contracts.keys import TRAINER_GROUP, RunKeys
from relayrl.contracts.messages import Batch, Group, Sample, encode_batch
from relayrl.contracts.streams import FIELD
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from relayrl_torch.models.loading import load_model
from trainer_svc import checkpoint
from trainer_svc.loop import Trainer
from trainer_svc.publisher import AsyncPublisher


@pytest.fixture
def env(tmp_path, tiny_lm):
    server = EmbeddedRedis(tmp_path)
    r = connect(server.url)
    cfg = RunConfig.model_validate({
        "run_id": "resume", "run_dir": str(tmp_path / "run"),
        "redis": {"url": server.url},
        "task": {"digits": 1, "eval_size": 4},
        "rollout": {"max_new_tokens": 3},
        "buffer": {"group_size": 2, "groups_per_batch": 2},
        "trainer": {"checkpoint": {"every": 2}, "max_staleness": 100,
                    "optimizer": {"lr": 1e-2}, "progress": False},
    })
    yield cfg, r, tiny_lm.path
    server.shutdown()


def make_batch(lm, first_prompt: int) -> Batch:
    groups = []
    for pid in (first_prompt, first_prompt + 1):
        prompt = lm.encode_prompt(f"{pid % 10}+1=")
        samples = [Sample(prompt_id=pid, lease_id=f"L{pid}", worker_id="w",
                          prompt_tokens=prompt, response_tokens=[5 + k, lm.eos_id],
                          logprobs=[-1.0, -0.5], versions=[0, 0], reward=float(k))
                   for k in range(2)]
        groups.append(Group(pid, samples))
    return Batch(f"b{first_prompt}", groups)


def new_trainer(cfg, r, model_path, relay: VersionStore | None = None):
    torch.manual_seed(0)
    return Trainer(cfg.trainer_part(), load_model(model_path), r,
                   AsyncPublisher(relay or VersionStore(16)))


def step_once(trainer):
    entry_id, batch = trainer.next_batch(threading.Event())
    trainer.train_step(entry_id, batch)
    if trainer.step % trainer.tc.checkpoint.every == 0:
        trainer.save_checkpoint()
    return entry_id


def test_restart_resumes_exactly(env):
    cfg, r, model_path = env
    keys = RunKeys(cfg.run_id)
    relay = VersionStore(16)
    first = new_trainer(cfg, r, model_path, relay)
    lm = first.lm
    entries = [r.xadd(keys.batches, {FIELD: encode_batch(make_batch(lm, 2 * i))})
               for i in range(3)]
    trained = [step_once(first) for _ in range(3)]
    assert trained == entries
    expected = {k: v.clone() for k, v in first.lm.model.state_dict().items()}
    first.publisher.close()
    del first  # the "crash": step 3 was trained but never made durable

    assert r.xpending(keys.batches, TRAINER_GROUP)["pending"] == 1
    assert ledger.members(r, keys, "consumed") == {0, 1, 2, 3}

    second = new_trainer(cfg, r, model_path, relay)
    second.resume()
    assert second.step == 2
    assert step_once(second) == entries[2]  # the one batch that was not durable, again
    second.publisher.wait()
    # the replayed step published version 3 again, bit for bit: the relay kept its copy
    assert relay.versions()[-1] == 3 and second.publisher.failures == 0
    for name, tensor in second.lm.model.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6)
    second.save_checkpoint()
    second.publisher.close()
    assert r.xpending(keys.batches, TRAINER_GROUP)["pending"] == 0
    assert r.xlen(keys.batches) == 0
    assert ledger.members(r, keys, "consumed") == set(range(6))


def test_a_delivery_whose_reply_was_lost_is_trained_next(env):
    """Redis moved an entry to the trainer's pending list and died before replying; the
    client's retry asked for the next new entry. The lost one must still be trained, in
    order, once."""
    cfg, r, model_path = env
    keys = RunKeys(cfg.run_id)
    trainer = new_trainer(cfg, r, model_path)
    lm = trainer.lm
    entries = [r.xadd(keys.batches, {FIELD: encode_batch(make_batch(lm, 2 * i))})
               for i in range(3)]
    assert step_once(trainer) == entries[0]
    # the lost reply: the entry is delivered to the trainer's consumer, the answer dropped
    from trainer_svc.loop import CONSUMER
    r.xreadgroup(TRAINER_GROUP, CONSUMER, {keys.batches: ">"}, count=1)
    assert [step_once(trainer) for _ in range(2)] == entries[1:]
    trainer.save_checkpoint()
    trainer.publisher.close()
    assert r.xpending(keys.batches, TRAINER_GROUP)["pending"] == 0
    assert ledger.members(r, keys, "consumed") == set(range(6))


def test_a_step_already_checkpointed_is_not_written_again(env):
    """The loop's periodic save at max_steps, then the final save: one write. A save after
    something was read (a batch whose groups were all dropped) writes again."""
    cfg, r, model_path = env
    keys = RunKeys(cfg.run_id)
    trainer = new_trainer(cfg, r, model_path)
    r.xadd(keys.batches, {FIELD: encode_batch(make_batch(trainer.lm, 0))})
    step_once(trainer)
    trainer.save_checkpoint()
    written = trainer.ckpt_dir / "step_00000001" / checkpoint.STATE_JSON
    stamp = written.stat().st_mtime_ns
    trainer.save_checkpoint()
    assert written.stat().st_mtime_ns == stamp  # same step, nothing read: not rewritten
    trainer.books.ledger.dropped.append(7)
    trainer.save_checkpoint()
    assert written.stat().st_mtime_ns != stamp and ledger.members(r, keys, "dropped") == {7}
    trainer.publisher.close()
