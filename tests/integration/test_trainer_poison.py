"""Batches already in Redis that the trainer cannot train on:
poison groups (a token id past the model's vocabulary, a sequence past its context, an entry
that does not decode) are quarantined, acknowledged and finished in the ledger, and the
trainer goes on, also after a restart that meets them again; steps whose loss is not finite
are skipped (no update, no publish), counted, recorded, and stop the run after
trainer.max_nonfinite_steps in a row with the last good checkpoint intact. The audit
balances throughout."""

import threading

import msgpack
import pytest
import torch

from relay_svc.version_store import VersionStore
from relayrl.config import RunConfig
from relayrl.contracts import ledger
from relayrl.contracts.keys import TRAINER_GROUP, RunKeys
from relayrl.contracts.messages import Batch, Group, Sample, encode_batch
from relayrl.contracts.streams import FIELD
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from relayrl_ops.audit import audit_redis, read_quarantine
from relayrl_torch.models.loading import load_model
from trainer_svc import checkpoint
from trainer_svc.finite import NonFiniteError
from trainer_svc.loop import Trainer
from trainer_svc.publisher import AsyncPublisher
from trainer_svc.record import step_record
from trainer_svc.server import trainer_metrics_of


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    yield server.url
    server.shutdown()


def new_trainer(tmp_path, url, run_id, model_path, **trainer):
    cfg = RunConfig.model_validate({
        "run_id": run_id, "run_dir": str(tmp_path / run_id), "redis": {"url": url},
        "task": {"digits": 1, "eval_size": 4},
        "rollout": {"max_new_tokens": 3},
        "buffer": {"group_size": 2, "groups_per_batch": 2},
        "trainer": {"max_staleness": 100, "optimizer": {"lr": 1e-2}, "progress": False,
                    "engine_check_seqs": 0, **trainer},
    })
    torch.manual_seed(0)
    return Trainer(cfg.trainer_part(), load_model(model_path), connect(url),
                   AsyncPublisher(VersionStore(16)))


def group(t: Trainer, pid: int, prompt=None, response=None) -> Group:
    """Two samples of prompt `pid`, rewards 0 and 1."""
    prompt = prompt or t.lm.encode_prompt(f"{pid % 10}+1=")
    responses = [response or [5 + k, t.lm.eos_id] for k in range(2)]
    return Group(pid, [
        Sample(prompt_id=pid, lease_id=f"L{pid}", worker_id="w", prompt_tokens=prompt,
               response_tokens=resp, logprobs=[-1.0] * len(resp), versions=[0] * len(resp),
               reward=float(k))
        for k, resp in enumerate(responses)])


def push(t: Trainer, pids: list[int], payload: bytes) -> bytes:
    """An entry in the batch stream, its prompts leased and batched as the services would."""
    r, keys = t.r, t.keys
    ledger.add(r, keys, "leased", pids)
    ledger.add(r, keys, "batched", pids)
    return r.xadd(keys.batches, {FIELD: payload})


def push_groups(t: Trainer, groups: list[Group]) -> bytes:
    return push(t, [g.prompt_id for g in groups], encode_batch(Batch("b", groups)))


def test_poison_batches_are_quarantined_and_the_trainer_goes_on(tmp_path, redis_url, tiny_lm):
    t = new_trainer(tmp_path, redis_url, "poison", tiny_lm.path)
    vocab, context = t.set_aside.limits.vocab_size, t.set_aside.limits.context_length
    assert vocab == tiny_lm.model.get_input_embeddings().num_embeddings
    push_groups(t, [group(t, 1, response=[1000, t.lm.eos_id]), group(t, 2)])
    push_groups(t, [group(t, 3, prompt=[vocab])])
    push_groups(t, [group(t, 4, prompt=[5] * context)])  # + the response: past the context
    # does not decode (a sample lacks every field), yet names its prompt
    push(t, [5], msgpack.packb({"schema": 1, "kind": "batch", "batch_id": "x", "groups": [
        {"prompt_id": 5, "samples": [{"bogus": 1}]}]}, use_bin_type=True))
    push_groups(t, [group(t, 6)])

    def two_steps(trainer: Trainer) -> list[dict]:
        stop = threading.Event()
        return [step_record(trainer.train_step(*trainer.next_batch(stop))).to_json()
                for _ in range(2)]

    # the first trainer dies before its checkpoint: a restart meets every poison entry again
    two_steps(t)
    t.publisher.close()
    t = new_trainer(tmp_path, redis_url, "poison", tiny_lm.path)
    t.resume()
    first, second = two_steps(t)
    assert (first["train/groups"], second["train/groups"]) == (1, 1)  # groups 2 and 6
    assert second["train/groups_quarantined"] == 4
    assert second["train/batches_quarantined"] == 4
    t.save_checkpoint()
    t.publisher.close()

    keys = RunKeys("poison")
    assert ledger.members(t.r, keys, "consumed") == {2, 6}
    assert ledger.members(t.r, keys, "dropped") == {1, 3, 4, 5}
    assert t.r.xpending(keys.batches, TRAINER_GROUP)["pending"] == 0
    assert t.r.xlen(keys.batches) == 0
    records = read_quarantine(t.r, keys)
    reasons = sorted(rec["reason"] for rec in records.values())
    assert len(records) == 4 and len(t.r.xrange(keys.quarantine)) == 4  # once each
    assert any(f"token id 1000 is past the vocabulary of the trainer's model ({vocab}" in x
               for x in reasons), reasons
    assert any(f"token id {vocab} is past" in x for x in reasons), reasons
    assert any(f"past the context length of the trainer's model ({context})" in x
               for x in reasons), reasons
    assert {rec["kind"] for rec in records.values()} == {"poison", "undecodable"}
    report = audit_redis(t.r, "poison", max_steps=2)
    assert report.balanced, report.render()
    assert report.counts["quarantined_entries"] == 4
    assert report.counts["dropped"] == 4 and report.counts["awaiting_trainer"] == 0
    assert "token id 1000" in report.render()


def test_nonfinite_steps_are_skipped_and_stop_the_run_after_the_limit(tmp_path, redis_url,
                                                                     tiny_lm):
    t = new_trainer(tmp_path, redis_url, "nonfinite", tiny_lm.path, max_nonfinite_steps=2)
    stop = threading.Event()

    def step(pids: list[int], temperature: float) -> dict:
        t.objective.temperature = temperature  # 1e-300: a live setting that overflows the loss
        push_groups(t, [group(t, p) for p in pids])
        return step_record(t.train_step(*t.next_batch(stop))).to_json()

    step([10, 11], 1.0)
    t.save_checkpoint()
    good = checkpoint.latest(t.ckpt_dir)
    weights = {k: v.clone() for k, v in t.lm.model.state_dict().items()}
    t.publisher.wait()
    published = t.publisher.versions_published

    skipped = step([12, 13], 1e-300)
    assert skipped["train/step_skipped"] == 1 and skipped["train/nonfinite_steps"] == 1
    assert t.step == 1 and "train/loss" not in skipped
    assert all(torch.equal(v, weights[k]) for k, v in t.lm.model.state_dict().items())
    assert all(p.grad is None for p in t.lm.model.parameters())
    t.publisher.wait()
    assert t.publisher.versions_published == published
    assert trainer_metrics_of(t).snapshot()["train/nonfinite_steps"] == 1
    assert step([14, 15], 1.0)["step"] == 2  # a good step ends the run of skipped ones
    step([16, 17], 1e-300)
    with pytest.raises(NonFiniteError, match=r"trainer.max_nonfinite_steps is 2"):
        step([18, 19], 1e-300)
    assert checkpoint.latest(t.ckpt_dir) == good
    t.publisher.close()

    records = read_quarantine(t.r, RunKeys("nonfinite"))
    assert sorted(tuple(r["prompt_ids"]) for r in records.values()) == [
        (12, 13), (16, 17), (18, 19)]
    assert all(r["kind"] == "nonfinite_step" and "not finite" in r["reason"]
               for r in records.values())
    assert t.books.ledger.dropped == [12, 13, 16, 17, 18, 19]  # acknowledged at the next checkpoint
    assert t.books.ledger.consumed == [14, 15]
