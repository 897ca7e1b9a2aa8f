"""A scheduler killed mid-run and started again on the same Redis takes up where the dead one
left off: it hands out no prompt id twice as new, leases again every prompt that was out
(its lease died with the old process), and never reuses a lease id a worker may still hold."""

import pytest

from relayrl.config import RunConfig
from relayrl.contracts import ledger
from relayrl.contracts.keys import RunKeys
from relayrl.runtime.redis_conn import connect
from relayrl_ops.redis_server import RedisServer
from scheduler_svc.core import SchedulerCore


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def redis(tmp_path):
    server = RedisServer(tmp_path, die_with_launcher=False)
    server.start()
    yield connect(server.url)
    server.shutdown()


CFG = RunConfig.model_validate({
    "run_id": "restart",
    "scheduler": {"lease_ttl_s": 10, "max_attempts": 2, "max_inflight_prompts": 4,
                  "max_prompts": 8},
    "buffer": {"group_size": 2, "groups_per_batch": 2},
    "rollout": {}})


def test_a_restarted_scheduler_leases_again_what_was_out_and_goes_on(redis):
    clock = FakeClock()
    first = SchedulerCore(CFG.scheduler_part(), redis, clock=clock)
    first.register("w0", "here")
    out = first.acquire("w0", 4).leases
    assert [lp.prompt_id for lp in out] == [0, 1, 2, 3]
    # prompts 0 and 1 reached the buffer and were batched; 2 and 3 were still generating
    assert first.complete("w0", out[0].lease_id) and first.complete("w0", out[1].lease_id)
    ledger.add(redis, RunKeys(CFG.run_id), "batched", [0, 1])

    # the first died with its leases
    second = SchedulerCore(CFG.scheduler_part(), redis, clock=clock)
    second.register("w0", "here")
    again = second.acquire("w0", 4).leases
    assert [lp.prompt_id for lp in again] == [2, 3]  # the cap holds: 4 out, none finished
    assert not {lp.lease_id for lp in again} & {lp.lease_id for lp in out}
    assert second.policy.handed_out == 4


def test_new_prompts_continue_after_the_last_one_handed_out(redis):
    clock = FakeClock()
    first = SchedulerCore(CFG.scheduler_part(), redis, clock=clock)
    first.register("w0", "here")
    out = first.acquire("w0", 3).leases
    keys = RunKeys(CFG.run_id)
    ledger.add(redis, keys, "batched", [lp.prompt_id for lp in out])
    redis.set(keys.prompts_finished, 3)  # the trainer stepped past all three

    second = SchedulerCore(CFG.scheduler_part(), redis, clock=clock)
    second.refresh()
    second.register("w0", "here")
    assert [lp.prompt_id for lp in second.acquire("w0", 2).leases] == [3, 4]


def test_a_restarted_scheduler_hands_out_the_same_records(redis, tmp_path):
    """A dataset task's prompt id is a pure function of (seed, epoch, index): the records a
    restarted scheduler leases again are the ones the first one leased."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"q": "question {i}", "answer": "{i}", "n": {i}}}\n'
                            for i in range(5)))
    cfg = RunConfig.model_validate({
        **CFG.model_dump(include={"scheduler", "buffer", "rollout"}), "run_id": "restart-data",
        "model": {"kind": "pretrained"},
        "task": {"source": "dataset", "path": str(rows), "prompt": {"field": "q"},
                 "eval_size": 0}})
    clock = FakeClock()
    first = SchedulerCore(cfg.scheduler_part(), redis, clock=clock)
    first.register("w0", "here")
    out = first.acquire("w0", 4).leases
    second = SchedulerCore(cfg.scheduler_part(), redis, clock=clock)
    second.register("w0", "here")
    again = second.acquire("w0", 4).leases
    assert [(lp.prompt_id, lp.messages, lp.reference, lp.metadata) for lp in again] == [
        (lp.prompt_id, lp.messages, lp.reference, lp.metadata) for lp in out]
