"""One lease contract, two implementations: SchedulerCore in process and over gRPC.
Both run on a real (embedded) Redis, which holds the ledger."""

import grpc
import pytest

from relayrl.config import RunConfig
from relayrl.contracts import ledger
from relayrl.contracts.control import SettingsChange
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.leases import GrpcLeaseClient, ProgressReply
from relayrl.contracts.proto.v1 import scheduler_pb2_grpc
from relayrl.runtime.grpc_util import make_server
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from scheduler_svc.core import SchedulerCore
from scheduler_svc.server import SchedulerServicer
from tests.conftest import free_ports


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def redis(tmp_path):
    server = EmbeddedRedis(tmp_path)
    yield connect(server.url)
    server.shutdown()


@pytest.fixture(params=["in_process", "grpc"])
def setup(request, redis):
    cfg = RunConfig.model_validate({
        "run_id": "leases",
        "scheduler": {"lease_ttl_s": 10, "max_attempts": 2, "max_inflight_prompts": 3,
                      "max_prompts": 5, "repack": True, "repack_interval_s": 0,
                      "call_timeout_s": 2, "heartbeat_interval_s": 1},  # 5 s unheld grace
        "rollout": {"segment_tokens": 4, "max_active_groups": 2}})
    clock = FakeClock()
    core = SchedulerCore(cfg.scheduler_part(), redis, clock=clock)
    if request.param == "in_process":
        yield core, core, clock, redis
        return
    (port,) = free_ports(1)
    server, _ = make_server(f"127.0.0.1:{port}", [
        (scheduler_pb2_grpc.add_SchedulerServicer_to_server, SchedulerServicer(core))])
    server.start()
    client = GrpcLeaseClient(f"127.0.0.1:{port}")
    yield client, core, clock, redis
    client.close()
    server.stop(0)


def test_prompts_come_from_the_task_and_land_in_the_ledger(setup):
    client, core, _, redis = setup
    client.register("w0", "here")
    batch = client.acquire("w0", 2)
    assert [lp.prompt_id for lp in batch.leases] == [0, 1]
    p = core.task.problem(0)
    assert (batch.leases[0].text, batch.leases[0].reference) == (p.text, p.reference)
    assert ledger.members(redis, RunKeys("leases"), "leased") == {0, 1}


def test_inflight_cap_then_trainer_progress_releases_more(setup):
    client, core, _, redis = setup
    assert len(client.acquire("w0", 5).leases) == 3
    empty = client.acquire("w0", 1)
    assert empty.leases == [] and empty.retry_after_s > 0 and not empty.done
    redis.set(RunKeys("leases").prompts_finished, 2)  # the trainer stepped past 2 prompts
    core.refresh()
    assert [lp.prompt_id for lp in client.acquire("w0", 5).leases] == [3, 4]
    assert client.acquire("w0", 5).leases == []  # max_prompts (5) reached


def test_a_capped_lease_call_reads_the_trainers_progress_at_once(setup):
    """A step that ends frees the cap for the next call, not at the next refresh."""
    client, core, _, redis = setup
    assert len(client.acquire("w0", 5).leases) == 3
    keys = RunKeys("leases")
    redis.set(keys.prompts_finished, 2)
    redis.set(keys.trainer_version, 7)
    batch = client.acquire("w0", 5)  # no refresh() in between
    assert [lp.prompt_id for lp in batch.leases] == [3, 4]
    assert batch.min_version == 7 - core.cfg.scheduler.max_start_lag


def test_a_capped_lease_call_with_redis_down_answers_from_the_last_figures(setup, redis):
    import redis as redis_py

    client, core, _, _ = setup
    assert len(client.acquire("w0", 5).leases) == 3
    core.redis = redis_py.Redis(port=free_ports(1)[0], socket_connect_timeout=0.5)  # refused
    assert client.acquire("w0", 5).leases == []  # answered, not failed
    assert core.progress_unread
    core.redis = redis
    redis.set(RunKeys("leases").prompts_finished, 2)
    assert client.acquire("w0", 5).leases == []  # no read until refresh() succeeds
    core.refresh()
    assert not core.progress_unread
    assert [lp.prompt_id for lp in client.acquire("w0", 5).leases] == [3, 4]


def test_lapsed_lease_is_reissued_and_the_old_one_refused(setup):
    client, core, clock, _ = setup
    client.register("w0", "")
    first = client.acquire("w0", 1).leases[0]
    clock.now = 11.0
    core.refresh()
    again = client.acquire("w1", 1).leases[0]
    assert (again.prompt_id, again.attempt) == (first.prompt_id, 2)
    assert not client.complete("w0", first.lease_id)
    assert client.complete("w1", again.lease_id)


def test_heartbeats_keep_leases_alive(setup):
    client, core, clock, _ = setup
    client.register("w0", "")
    lease = client.acquire("w0", 1).leases[0]
    clock.now = 8.0
    assert client.heartbeat("w0", 4)
    clock.now = 15.0
    core.refresh()
    assert client.complete("w0", lease.lease_id)
    assert not client.heartbeat("stranger", 0)


def test_done_once_every_prompt_is_delivered(setup):
    client, core, _, redis = setup
    redis.set(RunKeys("leases").prompts_finished, 10)
    core.refresh()
    leases = client.acquire("w0", 10).leases
    assert len(leases) == 5
    for lp in leases:
        assert client.complete("w0", lp.lease_id)
    assert client.acquire("w0", 1).done


def test_bad_requests_are_refused_with_the_field(setup):
    client, _, _, _ = setup
    errors = (ValueError, grpc.RpcError)
    with pytest.raises(errors) as info:
        client.acquire("w0", 0)
    msg = str(info.value) if isinstance(info.value, ValueError) else info.value.details()
    assert "max_prompts" in msg
    with pytest.raises(errors):
        client.acquire("", 1)


def _state(core, prompt_id: int, tokens_each: int) -> bytes:
    from relayrl.contracts.partial import PartialGroup

    group = PartialGroup.fresh(prompt_id, [1, 5, 6], core.cfg.groups.group_size)
    for s in group.sequences:
        s.extend([7] * tokens_each, [-0.5] * tokens_each, version=3)
    return group.encode()


def test_saved_progress_travels_with_the_reissued_lease(setup):
    client, core, clock, _ = setup
    lease = client.acquire("w0", 1).leases[0]
    assert lease.partial_state == b""
    state = _state(core, lease.prompt_id, 2)
    assert client.save_progress("w0", lease.lease_id, state).accepted
    assert not client.save_progress("w1", lease.lease_id, state).accepted  # not the holder
    clock.now = 11.0  # w0 dies: its lease lapses
    core.refresh()
    again = client.acquire("w1", 1).leases[0]
    assert (again.prompt_id, again.partial_state) == (lease.prompt_id, state)
    assert client.complete("w1", again.lease_id)
    assert core.saved.partials == {}  # delivered: the saved state is forgotten


def test_progress_saved_together_answers_each_lease_in_order(setup):
    client, core, _, _ = setup
    mine, other = client.acquire("w0", 1).leases[0], client.acquire("w1", 1).leases[0]
    saves = [(mine.lease_id, _state(core, mine.prompt_id, 1)),
             (other.lease_id, _state(core, other.prompt_id, 1)),  # w1's: refused
             ("L-unknown", _state(core, mine.prompt_id, 1))]
    assert client.save_progress_many("w0", saves) == [ProgressReply(True), ProgressReply(False),
                                                      ProgressReply(False)]
    assert set(core.saved.partials) == {mine.prompt_id}
    assert client.save_progress_many("w0", []) == []


def test_release_hands_back_at_once_with_its_state(setup):
    client, core, _, _ = setup
    lease = client.acquire("w0", 1).leases[0]
    state = _state(core, lease.prompt_id, 1)
    assert client.release("w0", lease.lease_id, state)
    again = client.acquire("w1", 1).leases[0]
    assert (again.prompt_id, again.attempt, again.partial_state) == (lease.prompt_id, 1, state)
    assert not client.release("w1", lease.lease_id)  # not w1's to hand back
    assert client.release("w0", lease.lease_id)  # w0's repeated call: answered, no change
    assert client.complete("w1", again.lease_id)


def test_malformed_progress_is_refused_naming_the_field_and_nothing_changes(setup):
    client, core, _, _ = setup
    lease = client.acquire("w0", 1).leases[0]
    errors = (ValueError, grpc.RpcError)
    for bad in (b"junk", _state(core, lease.prompt_id + 1, 1)):
        with pytest.raises(errors) as info:
            client.save_progress("w0", lease.lease_id, bad)
        msg = str(info.value) if isinstance(info.value, ValueError) else info.value.details()
        assert "SaveProgress.state" in msg
    assert core.saved.partials == {}
    assert client.complete("w0", lease.lease_id)


def _tail_state(core, prompt_id: int, unfinished: int) -> bytes:
    from relayrl.contracts.partial import PartialGroup

    group = PartialGroup.fresh(prompt_id, [1, 5, 6], core.cfg.groups.group_size)
    for i, s in enumerate(group.sequences):
        s.extend([7, 8], [-0.5, -0.25], version=2)
        s.finish_reason = None if i < unfinished else "stop"
    return group.encode()


def test_a_repack_moves_a_tail_lease_with_its_state_to_the_fuller_worker(setup):
    client, core, clock, _ = setup
    for w in ("w0", "w1"):
        client.register(w, "here")
    full = client.acquire("w0", 2).leases  # capacity 2 groups x 8 = 16 sequences
    tail = client.acquire("w1", 1).leases[0]  # the cap of 3 prompts out is reached
    for lease in full:
        assert client.save_progress("w0", lease.lease_id, _tail_state(core, lease.prompt_id, 4))
    state = _tail_state(core, tail.prompt_id, 2)  # 2 of 16 seats used: a tail
    assert client.save_progress("w1", tail.lease_id, state) == ProgressReply(True, False)

    moves = core.repack()
    assert [(m.item, m.size, m.source, m.target) for m in moves] == [
        (tail.lease_id, 2, "w1", "w0")]
    assert core.repack() == []  # a move under way is not planned twice
    assert client.save_progress("w1", tail.lease_id, state) == ProgressReply(True, True)
    assert client.release("w1", tail.lease_id)
    assert client.acquire("w1", 1).leases == []  # reserved for w0
    moved = client.acquire("w0", 1).leases[0]
    assert (moved.prompt_id, moved.attempt, moved.partial_state) == (tail.prompt_id, 1, state)
    c = core.policy.counters
    assert (c.leases_recalled, c.leases_moved) == (1, 1)


def test_a_recalled_lease_whose_target_does_not_come_goes_to_anyone(setup):
    client, core, clock, _ = setup
    for w in ("w0", "w1", "w2"):
        client.register(w, "here")
    full = client.acquire("w0", 2).leases
    tail = client.acquire("w1", 1).leases[0]
    for lease in full:
        client.save_progress("w0", lease.lease_id, _tail_state(core, lease.prompt_id, 4))
    client.save_progress("w1", tail.lease_id, _tail_state(core, tail.prompt_id, 1))
    assert [m.target for m in core.repack()] == ["w0"]
    assert client.release("w1", tail.lease_id)
    assert client.acquire("w2", 1).leases == []
    clock.now = 10.5  # one lease TTL later the reservation has lapsed (w0's heartbeats
    client.heartbeat("w0", 0)  # keep its own leases)
    client.heartbeat("w2", 0)
    again = client.acquire("w2", 1).leases[0]
    assert (again.prompt_id, again.attempt) == (tail.prompt_id, 1)
    assert core.policy.counters.leases_moved == 0


def test_leases_name_the_oldest_weights_worth_starting_with(setup, redis):
    client, core, _, _ = setup
    redis.set(RunKeys("leases").trainer_version, 6)
    core.refresh()
    batch = client.acquire("w0", 1)
    # a prompt started on weights older than 6 - scheduler.max_start_lag (1) would have
    # fewer steps to finish in before trainer.max_staleness (4) drops it
    assert batch.leases and batch.min_version == 5
    if core is client:  # a tighter live bound tightens the start too
        core.change_settings(SettingsChange(max_staleness=0))
        assert client.acquire("w0", 1).min_version == 6


# A lost or repeated reply changes nothing : each call
# below is made twice, as a client does when the first reply never reached it.

def test_a_retried_acquire_is_answered_with_the_same_leases(setup, redis):
    client, core, _, _ = setup
    client.register("w0", "here", "proc-1")
    first = client.acquire("w0", 2, "req-1")
    again = client.acquire("w0", 2, "req-1")
    assert [lp.lease_id for lp in again.leases] == [lp.lease_id for lp in first.leases]
    assert [lp.prompt_id for lp in again.leases] == [0, 1]
    assert core.policy.handed_out == 2 and core.policy.counters.leases_granted == 2
    assert [lp.prompt_id for lp in client.acquire("w0", 2, "req-2").leases] == [2]
    assert ledger.members(redis, RunKeys("leases"), "leased") == {0, 1, 2}


def test_a_repeated_complete_is_accepted_and_counted_once(setup):
    client, core, _, _ = setup
    lease = client.acquire("w0", 1, "req-1").leases[0]
    assert client.complete("w0", lease.lease_id)
    assert client.complete("w0", lease.lease_id)
    assert not client.complete("w1", lease.lease_id)
    assert core.policy.counters.leases_completed == 1


def test_a_repeated_release_changes_nothing(setup):
    client, core, _, _ = setup
    lease = client.acquire("w0", 1).leases[0]
    old = _state(core, lease.prompt_id, 1)
    assert client.release("w0", lease.lease_id, old)
    again = client.acquire("w1", 1).leases[0]
    newer = _state(core, lease.prompt_id, 2)
    assert client.save_progress("w1", again.lease_id, newer).accepted
    assert client.release("w0", lease.lease_id, old)  # the retry, with its older state
    assert core.saved.partials[lease.prompt_id] == newer
    assert set(core.policy.leases) == {again.lease_id}
    assert core.policy.counters.leases_released == 1
    assert client.save_progress("w1", again.lease_id, newer).accepted  # saved twice: same


def test_a_repeated_register_of_the_same_process_keeps_its_leases(setup):
    client, core, _, _ = setup
    client.register("w0", "here", "proc-1")
    lease = client.acquire("w0", 1).leases[0]
    client.register("w0", "here", "proc-1")
    assert set(core.policy.leases) == {lease.lease_id}
    client.register("w0", "here", "proc-2")  # a new process: the old one's leases lapse
    assert core.policy.leases == {} and core.policy.counters.leases_expired == 1


def test_a_lease_absent_from_the_holders_heartbeats_is_reissued(setup):
    """The hang a lost reply caused: a worker whose lease request timed out never learns of
    the grant, and its heartbeats used to renew the orphan for as long as it ran."""
    client, core, clock, _ = setup
    client.register("w0", "here", "proc-1")
    kept, orphan = client.acquire("w0", 2, "lost").leases
    for t in (1.0, 4.0):  # within the grace the grant may still be on its way
        clock.now = t
        assert client.heartbeat("w0", 0, [kept.lease_id])
    assert set(core.policy.leases) == {kept.lease_id, orphan.lease_id}
    for t in (5.0, 8.0, 12.0, 16.0):
        clock.now = t
        assert client.heartbeat("w0", 0, [kept.lease_id])
        core.refresh()
    assert set(core.policy.leases) == {kept.lease_id}  # renewed; the orphan is out
    assert core.policy.counters.leases_unheld == 1
    again = client.acquire("w1", 1).leases[0]
    assert (again.prompt_id, again.attempt) == (orphan.prompt_id, 1)


def test_a_heartbeat_past_its_deadline_renews_but_reissues_nothing(setup):
    """Its list may predate a grant the worker has received since (the servicer passes
    fresh=False for a call whose deadline has passed)."""
    _, core, clock, _ = setup
    core.register("w0", "here")
    lease = core.acquire("w0", 1).leases[0]
    clock.now = 9.0
    assert core.heartbeat("w0", 0, [], fresh=False)
    assert set(core.policy.leases) == {lease.lease_id}
    assert core.heartbeat("w0", 0, [lease.lease_id], fresh=False)
    clock.now = 18.0
    core.refresh()
    assert core.complete("w0", lease.lease_id)  # renewed at 9.0


def test_a_heartbeat_that_names_no_leases_renews_them_all(setup):
    client, core, clock, _ = setup
    client.register("w0", "here")
    lease = client.acquire("w0", 1).leases[0]
    for t in (6.0, 12.0, 18.0):
        clock.now = t
        assert client.heartbeat("w0", 0)  # an older client: no list
    core.refresh()
    assert client.complete("w0", lease.lease_id)
    assert core.policy.counters.leases_unheld == 0


def test_malformed_ids_are_refused_naming_the_field(setup):
    client, _, _, _ = setup
    errors = (ValueError, grpc.RpcError)
    for call, field in ((lambda: client.acquire("w0", 1, "x" * 129), "request_id"),
                        (lambda: client.acquire("w0", 1, "a b"), "request_id"),
                        (lambda: client.register("w0", "", "\n"), "incarnation"),
                        (lambda: client.heartbeat("w0", 0, ["ok", "no/"]), "lease_ids")):
        with pytest.raises(errors) as info:
            call()
        msg = str(info.value) if isinstance(info.value, ValueError) else info.value.details()
        assert field in msg


def test_a_lease_behind_a_whole_batch_asks_for_the_trainers_weights(redis):
    """At trainer.max_staleness 1 two batches are out: the second is trained a version after
    the first, so its prompts may not start a version behind (they would be dropped)."""
    cfg = RunConfig.model_validate({"run_id": "floor", "buffer": {"groups_per_batch": 2},
                                    "trainer": {"max_staleness": 1}})
    core = SchedulerCore(cfg.scheduler_part(), redis, clock=FakeClock())
    redis.set(RunKeys("floor").trainer_version, 6)
    core.refresh()
    first = core.acquire("w0", 2)
    assert len(first.leases) == 2 and first.min_version == 5
    second = core.acquire("w1", 2)
    assert len(second.leases) == 2 and second.min_version == 6
