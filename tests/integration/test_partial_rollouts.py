"""Partial rollouts: responses generated in segments move to newer weights mid-sequence with
every token tagged by the version that produced it, and an unfinished group survives its
worker, handed back (graceful stop) or saved at a boundary every rollout.save_every_s
(kill), and resumes elsewhere."""

import threading

import pytest

from relay_svc.version_store import VersionStore
from relayrl.config import RunConfig
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.messages import Batch, Group, decode_group
from relayrl.contracts.partial import PartialGroup
from relayrl.contracts.streams import TrajectoryWriter
from relayrl.plugins.rewards import REWARDS, register
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from relayrl_torch.models.loading import load_model
from rollout_svc.engines.torch import TorchEngine
from rollout_svc.worker import RolloutWorker
from scheduler_svc.core import SchedulerCore
from trainer_svc.batching import split_stale

N, MAX_NEW = 4, 6


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


class PublishingEngine(TorchEngine):
    """After every segment the trainer 'publishes' a newer version to the relay."""

    def __init__(self, lm, store, after_segment=None, kv_cache_tokens=0):
        super().__init__(lm, seed=0, kv_cache_tokens=kv_cache_tokens)
        self.store, self.after_segment, self.calls = store, after_segment, 0

    def generate(self, contexts, spec):
        out = super().generate(contexts, spec)
        self.calls += 1
        if self.store is not None:
            state = {k: v + 0.001 * self.calls for k, v in self.lm.model.state_dict().items()}
            self.store.publish(self.calls + 1, self.calls + 1, state)
        if self.after_segment is not None:
            self.after_segment(self.calls)
        return out


@pytest.fixture
def stack(tmp_path, tiny_lm):
    server = EmbeddedRedis(tmp_path)
    r = connect(server.url)
    cfg = RunConfig.model_validate({
        "run_id": "partial", "task": {"digits": 1, "eval_size": 8},
        "scheduler": {"lease_ttl_s": 10, "max_prompts": 4},
        "buffer": {"group_size": N},
        "rollout": {"max_new_tokens": MAX_NEW, "segment_tokens": 2,
                    "save_every_s": 0,  # at every boundary, unless a test says otherwise
                    "temperature": 3.0}})  # hot sampling: eos rarely ends a response early
    clock = Clock()
    core = SchedulerCore(cfg.scheduler_part(), r, clock=clock)
    yield cfg, r, core, clock, tiny_lm
    server.shutdown()


def make_worker(cfg, r, core, tiny_lm, index, store, after_segment=None, kv_cache_tokens=0,
                clock=None):
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(
        update={"worker_index": index})})
    lm = load_model(tiny_lm.path)
    engine = PublishingEngine(lm, store, after_segment, kv_cache_tokens)
    writer = TrajectoryWriter(r, RunKeys("partial"), cfg.buffer.max_pending_samples)
    return RolloutWorker(cfg.rollout_part(), engine, lm, core, [store], writer, "exact_match",
                         **({"clock": clock} if clock else {}))


def delivered(r) -> list:
    entries = r.xrange(RunKeys("partial").trajectories)
    return [s for _, fields in entries for s in decode_group(fields[b"data"]).samples]


def run_one_lease(cfg, r, core, tiny_lm):
    """A worker starting on version 1 runs one lease whole (a newer version after every
    segment); returns the worker and the lease."""
    store = VersionStore(8)
    store.publish(1, 1, load_model(tiny_lm.path).model.state_dict())
    worker = make_worker(cfg, r, core, tiny_lm, 0, store)
    worker.refresh_weights()
    lease = core.acquire(worker.worker_id, 1).leases[0]
    assert worker.run_lease(lease)
    return worker, lease


def test_segments_move_to_newer_weights_and_tag_every_token(stack):
    cfg, r, core, _, tiny_lm = stack
    worker, lease = run_one_lease(cfg, r, core, tiny_lm)
    samples = delivered(r)
    assert len(samples) == N
    for s in samples:
        v = list(s.versions)
        assert v == sorted(v) and len(v) == len(s.logprobs) == len(s.response_tokens)
        assert len(v) <= MAX_NEW
        # two tokens per segment, and a new version before each segment
        assert v == [1 + i // 2 for i in range(len(v))]
    assert worker.generator.mid_sequence_swaps > 0 and worker.generator.segments == 3
    # the staleness rule looks at the oldest token of the group
    group = Group(prompt_id=lease.prompt_id, samples=samples)
    assert group.oldest_version == 1
    split = split_stale(Batch("b", [group]), version=4, max_staleness=2)
    assert split.stale == [group]


def test_when_behind_a_worker_holding_groups_reloads_only_once_it_may_start_none(stack):
    """rollout.reload when_behind: with scheduler.max_start_lag 1 the worker keeps version 1
    while version 2 is out and moves when version 3 is (relayrl.rules.staleness.behind)."""
    cfg, r, core, _, tiny_lm = stack
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(
        update={"reload": "when_behind"})})
    assert cfg.scheduler.max_start_lag == 1 < cfg.trainer.max_staleness
    worker, _ = run_one_lease(cfg, r, core, tiny_lm)
    for s in delivered(r):
        v = list(s.versions)
        assert v == [1, 1, 1, 1, 3, 3][:len(v)]
    assert worker.weights.weight_swaps == 2  # 1 at start, then 3; never 2
    worker.refresh_weights()  # holding nothing, it moves to the newest at once
    assert worker.engine.version == 4


def test_a_stopping_worker_hands_its_tokens_back_and_another_resumes(stack):
    cfg, r, core, _, tiny_lm = stack
    stop = threading.Event()
    a = make_worker(cfg, r, core, tiny_lm, 0, VersionStore(4), lambda calls: stop.set())
    lease = core.acquire(a.worker_id, 1).leases[0]
    assert not a.run_lease(lease, stop)
    assert a.boundary.leases_released == 1 and delivered(r) == []
    saved = PartialGroup.decode(core.saved.partials[lease.prompt_id], lease.prompt_id, N)
    assert all(len(s.tokens) == 2 or s.finish_reason == "stop" for s in saved.sequences)

    b = make_worker(cfg, r, core, tiny_lm, 1, VersionStore(4))
    again = core.acquire(b.worker_id, 1).leases[0]
    assert (again.prompt_id, again.attempt) == (lease.prompt_id, 1)  # not a failure
    assert b.run_lease(again) and b.generator.groups_resumed == 1
    # no KV came with the tokens: the prompt and every unfinished sequence's tokens again
    assert b.generator.tokens_reprefilled == len(saved.prompt_tokens) + sum(
        len(s.tokens) for s in saved.unfinished()) > 0
    samples = delivered(r)
    assert sorted(s.response_tokens[:2].tolist() for s in samples) == sorted(
        s.tokens[:2] for s in saved.sequences)
    assert core.saved.partials == {}


def test_a_killed_worker_loses_at_most_its_current_segment(stack):
    cfg, r, core, clock, tiny_lm = stack

    class Killed(Exception):
        pass

    def die(calls):
        if calls == 2:
            raise Killed  # dies inside its second segment, after saving the first

    a = make_worker(cfg, r, core, tiny_lm, 0, VersionStore(4), die)
    lease = core.acquire(a.worker_id, 1).leases[0]
    with pytest.raises(Killed):
        a.run_lease(lease)
    clock.now = 11.0  # its lease lapses without a heartbeat
    core.refresh()
    b = make_worker(cfg, r, core, tiny_lm, 1, VersionStore(4))
    again = core.acquire(b.worker_id, 1).leases[0]
    assert (again.prompt_id, again.attempt) == (lease.prompt_id, 2)
    saved = PartialGroup.decode(again.partial_state, lease.prompt_id, N)
    assert b.run_lease(again) and b.generator.groups_resumed == 1
    samples = delivered(r)
    assert len(samples) == N
    assert sorted(s.response_tokens[:2].tolist() for s in samples) == sorted(
        s.tokens[:2] for s in saved.sequences)


def test_token_state_is_saved_every_save_every_s_and_a_kill_loses_only_what_came_after(stack):
    cfg, r, core, clock, tiny_lm = stack
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(
        update={"save_every_s": 5.0})})

    class Killed(Exception):
        pass

    def segment_took_3_s(calls):
        clock.now += 3.0
        if calls == 2:  # the first boundary (t=3) was not due: nothing saved yet
            assert core.saved.partials == {}
        if calls == 3:
            raise Killed  # dies inside its third segment, after the save at t=6

    a = make_worker(cfg, r, core, tiny_lm, 0, VersionStore(4), segment_took_3_s, clock=clock)
    lease = core.acquire(a.worker_id, 1).leases[0]
    with pytest.raises(Killed):
        a.run_lease(lease)
    saved = PartialGroup.decode(core.saved.partials[lease.prompt_id], lease.prompt_id, N)
    assert all(len(s.tokens) == 4 or s.finish_reason == "stop" for s in saved.sequences)
    clock.now += 11.0  # its lease lapses without a heartbeat
    core.refresh()
    b = make_worker(cfg, r, core, tiny_lm, 1, VersionStore(4), clock=clock)
    again = core.acquire(b.worker_id, 1).leases[0]
    assert again.prompt_id == lease.prompt_id and again.partial_state
    assert b.run_lease(again) and b.generator.groups_resumed == 1
    samples = delivered(r)
    assert sorted(s.response_tokens[:4].tolist() for s in samples) == sorted(
        s.tokens[:4] for s in saved.sequences)


@pytest.mark.parametrize("save_every_s", [0.0, 100.0])
def test_a_repack_moves_a_tail_group_to_the_fuller_worker_which_finishes_it(stack,
                                                                           save_every_s):
    """Whether groups are saved at every boundary or rarely: a worker left with a tail
    saves at every boundary, so the planner sees it and its recall arrives."""
    cfg, r, _, _, tiny_lm = stack
    data = cfg.model_dump()
    data["rollout"]["save_every_s"] = save_every_s
    data["scheduler"].update(repack=True, repack_below=0.5, repack_interval_s=0,
                             max_inflight_prompts=3)
    data["rollout"].update(max_active_groups=3, temperature=0.01)  # 12 seats; eos-free-ish
    cfg = RunConfig.model_validate(data)
    core = SchedulerCore(cfg.scheduler_part(), r, clock=Clock())
    a = make_worker(cfg, r, core, tiny_lm, 0, None, kv_cache_tokens=4096)
    b = make_worker(cfg, r, core, tiny_lm, 1, None, kv_cache_tokens=4096)
    for w in (a, b):
        w.register()
    held_a = [a.activate(lease) for lease in core.acquire(a.worker_id, 2).leases]
    held_b = [b.activate(lease) for lease in core.acquire(b.worker_id, 1).leases]
    held_a, _ = a.advance(held_a)
    held_b, _ = b.advance(held_b)  # 4 of 12 seats: a tail; a runs 8 with room for 4 more
    tail = held_b[0].lease
    moves = core.repack()
    assert [(m.item, m.source, m.target) for m in moves] == [
        (tail.lease_id, b.worker_id, a.worker_id)]

    held_b, _ = b.advance(held_b)  # one more segment, saved, then handed over
    assert held_b == [] and b.boundary.groups_moved_out == 1
    saved = PartialGroup.decode(core.saved.partials[tail.prompt_id], tail.prompt_id, N)
    unfinished = len(saved.unfinished())
    assert core.acquire(b.worker_id, 1).leases == []  # reserved for a
    a._refill(held_a, threading.Event())
    assert a.generator.groups_resumed == 1 and len(held_a) == 3
    # both engines hold version 0: the moved sequences' KV caches come along and are used
    assert (a.generator.kv_imported, a.generator.kv_refused) == (unfinished, 0)
    assert a.generator.tokens_reprefilled == 0  # the caches came along: nothing to prefill again
    resumed_before = a.engine.tokens_resumed
    held_a, _ = a.advance(held_a)
    assert a.engine.tokens_resumed - resumed_before >= sum(
        len(saved.prompt_tokens) + len(s.tokens) - 1 for s in saved.unfinished())
    while held_a:
        held_a, _ = a.advance(held_a)

    samples = delivered(r)
    assert sorted(s.prompt_id for s in samples) == sorted([0, 1, 2] * N)  # each group once
    moved = [s for s in samples if s.prompt_id == tail.prompt_id]
    assert {s.worker_id for s in moved} == {a.worker_id}
    assert sorted(s.response_tokens[:4].tolist() for s in moved) == sorted(
        seq.tokens[:4] for seq in saved.sequences)  # b's two segments, continued by a
    assert (core.policy.counters.leases_recalled, core.policy.counters.leases_moved) == (1, 1)


def test_a_worker_behind_the_required_version_catches_up_before_it_starts(stack):
    cfg, r, core, _, tiny_lm = stack
    store = VersionStore(4)
    worker = make_worker(cfg, r, core, tiny_lm, 0, store)
    weights = load_model(tiny_lm.path).model.state_dict()
    store.publish(2, 2, weights)
    worker._catch_up(2, threading.Event())
    assert worker.engine.version == 2 and worker.weights.catch_up_timeouts == 0
    worker._catch_up(5, threading.Event())  # no relay serves 5: it waits, then goes on
    assert worker.engine.version == 2 and worker.weights.catch_up_timeouts == 1


def test_a_reward_outside_the_range_is_an_error_on_its_sample(stack):
    """A user's reward function answering 3e38 (finite, but its group's float32 mean would
    overflow) scores 0 with the error on each sample (buffer.reward_range), and the group is
    delivered, not poisoned."""
    cfg, r, core, _, tiny_lm = stack
    store = VersionStore(8)
    store.publish(1, 1, load_model(tiny_lm.path).model.state_dict())
    register("test_huge_reward")(lambda completion, reference: 3e38)
    try:
        lm = load_model(tiny_lm.path)
        worker = RolloutWorker(cfg.rollout_part(), PublishingEngine(lm, None), lm, core, [store],
                               TrajectoryWriter(r, RunKeys("partial"), 64), "test_huge_reward")
        worker.refresh_weights()
        assert worker.run_lease(core.acquire(worker.worker_id, 1).leases[0])
    finally:
        REWARDS.pop("test_huge_reward")
    samples = delivered(r)
    assert len(samples) == N
    assert {(s.reward, s.reward_error) for s in samples} == {
        (0.0, "ValueError: reward 3e+38 is outside buffer.reward_range [-10000, 10000]")}


def test_a_segments_groups_reach_the_buffer_before_their_leases_complete(stack):
    """A Complete round trip per group no longer stands between one group's append and the
    next's: the trainer's batch is whole one scheduler call per group sooner."""
    cfg, r, core, _, tiny_lm = stack
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(
        update={"segment_tokens": 0})})  # each group finishes in the first engine call
    store = VersionStore(8)
    store.publish(1, 1, load_model(tiny_lm.path).model.state_dict())
    worker = make_worker(cfg, r, core, tiny_lm, 0, store)
    worker.refresh_weights()
    order, append, complete = [], worker.writer.append, core.complete
    worker.writer.append = lambda group, stop=None: (order.append("append"),
                                                    append(group, stop))[1]
    core.complete = lambda worker_id, lease_id: (order.append("complete"),
                                                 complete(worker_id, lease_id))[1]
    active = [worker.activate(lease) for lease in core.acquire(worker.worker_id, 2).leases]
    still, delivered_now = worker.advance(active)
    assert (still, delivered_now) == ([], 2)
    assert order == ["append", "append", "complete", "complete"]
    assert worker.leases.held() == set() and len(delivered(r)) == 2 * N
