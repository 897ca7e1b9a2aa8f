"""The scheduler's lease state machine, driven with hand-built clocks."""

import pytest

from scheduler_svc.policy import LeasePolicy


def policy(**kw):
    args = dict(lease_ttl_s=10.0, max_attempts=2, max_inflight=100)
    args.update(kw)
    return LeasePolicy(**args)


def test_grants_new_prompts_in_order():
    p = policy()
    grants = p.acquire("w0", 3, now=0.0)
    assert [g.prompt_id for g in grants] == [0, 1, 2]
    assert all(g.attempt == 1 for g in grants)
    assert p.handed_out == 3 and len(p.leases) == 3


def test_inflight_bound_holds_back_new_prompts_until_the_trainer_catches_up():
    p = policy(max_inflight=2)
    assert len(p.acquire("w0", 5, now=0.0)) == 2
    assert p.acquire("w1", 1, now=0.0) == []
    p.set_finished(1)
    assert [g.prompt_id for g in p.acquire("w1", 5, now=0.0)] == [2]


def test_expired_lease_goes_back_to_the_front_of_the_queue():
    p = policy()
    first = p.acquire("w0", 1, now=0.0)[0]
    p.acquire("w0", 1, now=1.0)  # prompt 1, deadline 11
    assert p.expire(now=10.5)[0].lease_id == first.lease_id
    again = p.acquire("w1", 1, now=10.5)[0]
    assert (again.prompt_id, again.attempt) == (0, 2)
    assert not p.complete(first.lease_id, "w0")  # the old lease no longer counts


def test_heartbeat_renews_leases():
    p = policy()
    p.register("w0", now=0.0)
    p.acquire("w0", 1, now=0.0)
    assert p.heartbeat("w0", policy_version=3, now=8.0)
    assert p.expire(now=11.0) == []
    assert p.workers["w0"].policy_version == 3
    assert p.expire(now=18.0) != []


def test_unknown_worker_heartbeat_asks_to_register():
    assert not policy().heartbeat("ghost", 0, now=0.0)


def test_prompt_fails_after_max_attempts():
    p = policy(max_attempts=2)
    p.acquire("w0", 1, now=0.0)
    p.expire(now=10.0)
    p.acquire("w0", 1, now=10.0)
    p.expire(now=20.0)
    assert p.failed == {0}
    assert [g.prompt_id for g in p.acquire("w0", 1, now=20.0)] == [1]


def test_late_completion_of_requeued_prompt_is_accepted_once():
    p = policy(max_inflight=1)
    lease = p.acquire("w0", 1, now=0.0)[0]
    p.expire(now=10.0)
    assert list(p.requeue) == [0]
    assert p.complete(lease.lease_id, "w0")
    assert not p.requeue and p.counters.leases_completed == 1
    assert p.complete(lease.lease_id, "w0")  # its retry: accepted again, counted once
    assert not p.complete(lease.lease_id, "w1")
    assert p.counters.leases_completed == 1


def test_completion_by_another_worker_is_refused():
    p = policy()
    lease = p.acquire("w0", 1, now=0.0)[0]
    assert not p.complete(lease.lease_id, "w1")
    assert p.complete(lease.lease_id, "w0")


def test_done_after_the_last_prompt_is_delivered():
    p = policy(max_prompts=2)
    grants = p.acquire("w0", 5, now=0.0)
    assert len(grants) == 2 and not p.done
    for g in grants:
        p.complete(g.lease_id, "w0")
    assert p.done


def test_bad_request_size():
    with pytest.raises(ValueError, match="max_prompts"):
        policy().acquire("w0", 0, now=0.0)


def test_first_lease_waits_for_enough_workers_then_the_gate_stays_open():
    p = policy(start_after_workers=2)
    assert p.acquire("w0", 1, now=0.0) == []
    p.register("w1", now=1.0)
    assert [g.prompt_id for g in p.acquire("w0", 1, now=1.0)] == [0]
    del p.workers["w1"]  # a worker lost later does not close the gate again
    assert [g.prompt_id for g in p.acquire("w0", 1, now=2.0)] == [1]


def test_released_lease_goes_back_at_once_without_costing_an_attempt():
    p = policy(max_attempts=1)
    lease = p.acquire("w0", 1, now=0.0)[0]
    assert not p.release(lease.lease_id, "w1", now=0.0)  # only the holder may hand it back
    assert p.release(lease.lease_id, "w0", now=0.0)
    again = p.acquire("w1", 1, now=1.0)[0]
    assert (again.prompt_id, again.attempt) == (lease.prompt_id, 1)
    assert not p.complete(lease.lease_id, "w0")  # the handed-back lease is gone
    assert p.complete(again.lease_id, "w1") and p.failed == set()


def test_a_restarted_worker_registering_again_lapses_its_old_leases():
    p = policy(max_attempts=3)
    old = p.acquire("w0", 2, now=0.0)
    other = p.acquire("w1", 1, now=0.0)[0]
    p.register("w0", now=1.0)  # the process died and came back under the same name
    assert set(p.leases) == {other.lease_id}
    again = p.acquire("w0", 2, now=1.0)
    assert sorted(g.prompt_id for g in again) == sorted(g.prompt_id for g in old)
    assert all(g.attempt == 2 for g in again)
    assert p.heartbeat("w0", 0, now=2.0)
    assert not {g.lease_id for g in old} & set(p.leases)


def test_a_settled_prompt_leaves_no_per_prompt_state():
    """A run hands out prompts without end: what the policy keeps per prompt must go once
    the prompt can no longer be leased (delivered, failed), lapses and retries included."""
    p = policy(max_inflight=4, max_attempts=2)
    for round_ in range(50):
        now = 100.0 * round_
        grants = p.acquire("w0", 4, now=now)
        assert len(grants) == 4
        first, *rest = grants
        p.expire(now=now + 10.0)  # every lease lapses; its prompt is re-queued
        assert p.complete(first.lease_id, "w0")  # a late delivery still settles one
        for g in p.acquire("w0", 3, now=now + 10.0):  # the others: second and last attempt
            p.complete(g.lease_id, "w0")
        p.finished += 4
    assert not p.leases and not p.requeue
    assert p.attempts == {} and p.expired == {} and p.reserved == {}
    assert p.counters.leases_completed == 200


def test_a_failed_prompt_leaves_only_its_failure():
    p = policy(max_attempts=1)
    p.acquire("w0", 1, now=0.0)
    p.expire(now=10.0)
    assert p.failed == {0} and p.attempts == {} and p.expired == {}


def test_a_retried_acquire_gets_the_same_leases_and_no_new_ones():
    p = policy(max_inflight=3)
    first = p.acquire("w0", 2, now=0.0, request_id="r1")
    assert p.acquire("w0", 2, now=5.0, request_id="r1") == first  # the first reply was lost
    assert p.handed_out == 2 and p.counters.leases_granted == 2
    assert p.expire(now=12.0) == []  # granted again at 5.0: renewed
    assert [g.prompt_id for g in p.acquire("w0", 2, now=6.0, request_id="r2")] == [2]
    assert p.acquire("w1", 1, now=6.0, request_id="r1") == []  # ids are per worker


def test_a_retry_gets_only_the_leases_still_its_own_and_an_empty_one_grants_anew():
    p = policy(max_inflight=1)
    lease = p.acquire("w0", 1, now=0.0, request_id="r1")[0]
    p.expire(now=10.0)  # lapsed before the retry came
    assert [g.prompt_id for g in p.acquire("w1", 1, now=10.0)] == [lease.prompt_id]
    assert p.acquire("w0", 1, now=11.0, request_id="r1") == []
    assert p.acquire("w0", 1, now=11.0, request_id="r1") == []  # nothing out: asks again


def test_a_restarted_worker_does_not_get_its_old_process_grants():
    p = policy()
    p.register("w0", now=0.0, incarnation="a")
    old = p.acquire("w0", 1, now=0.0, request_id="r1")[0]
    p.register("w0", now=1.0, incarnation="b")
    again = p.acquire("w0", 1, now=1.0, request_id="r1")[0]
    assert again.lease_id != old.lease_id and again.attempt == 2


def test_a_repeated_register_of_the_same_process_keeps_its_leases():
    p = policy()
    p.register("w0", now=0.0, incarnation="a")
    lease = p.acquire("w0", 1, now=0.0)[0]
    p.register("w0", now=1.0, incarnation="a")  # its first reply was lost
    assert set(p.leases) == {lease.lease_id}
    p.register("w0", now=2.0)  # a process that does not say which it is: a restart
    assert p.leases == {}


def test_heartbeats_renew_only_the_leases_the_worker_names():
    p = policy(unheld_grace_s=4.0)
    p.register("w0", now=0.0)
    kept, orphan = p.acquire("w0", 2, now=0.0)
    assert p.heartbeat("w0", 0, now=3.0, held={kept.lease_id})
    assert p.release_unheld("w0", {kept.lease_id}, now=3.0) == []  # may still be on its way
    gone = p.release_unheld("w0", {kept.lease_id}, now=4.0)
    assert [lease.lease_id for lease in gone] == [orphan.lease_id]
    assert p.counters.leases_unheld == 1 and set(p.leases) == {kept.lease_id}
    again = p.acquire("w1", 1, now=4.0)[0]  # re-issued at once, costing no attempt
    assert (again.prompt_id, again.attempt) == (orphan.prompt_id, 1)
    assert p.expire(now=12.0) == []  # renewed at 3.0


def test_an_unheld_lease_lapses_even_while_its_worker_keeps_beating():
    """The hang a lost reply caused: a grant whose reply was lost, renewed by every
    heartbeat of its worker, kept the in-flight cap full for ever."""
    p = policy(max_inflight=1, unheld_grace_s=5.0)
    p.register("w0", now=0.0)
    p.acquire("w0", 1, now=0.0, request_id="lost")
    for now in range(1, 30):
        p.heartbeat("w0", 0, now=float(now), held=set())
        p.release_unheld("w0", set(), now=float(now))
    assert [g.prompt_id for g in p.acquire("w0", 1, now=30.0, request_id="next")] == [0]


def test_a_late_delivery_of_an_unheld_lease_still_counts_once():
    p = policy(unheld_grace_s=0.0)
    lease = p.acquire("w0", 1, now=0.0)[0]
    p.release_unheld("w0", set(), now=1.0)
    assert p.complete(lease.lease_id, "w0") and p.complete(lease.lease_id, "w0")
    assert p.counters.leases_completed == 1 and not p.requeue


def test_a_repeated_release_changes_nothing():
    p = policy()
    lease = p.acquire("w0", 1, now=0.0)[0]
    assert p.release(lease.lease_id, "w0", now=0.0)
    again = p.acquire("w1", 1, now=1.0)[0]
    assert p.release(lease.lease_id, "w0", now=2.0)  # the retry: accepted, nothing moves
    assert set(p.leases) == {again.lease_id} and not p.requeue
    assert p.counters.leases_released == 1
    assert not p.release(lease.lease_id, "w1", now=2.0)


def test_retry_memory_stays_bounded():
    p = policy(max_inflight=10_000)
    for i in range(3 * p.memory.limit):
        g = p.acquire("w0", 1, now=0.0, request_id=f"r{i}")[0]
        p.complete(g.lease_id, "w0")
        p.finished += 1
    assert len(p.memory.outcomes) == p.memory.limit and len(p.memory.last_acquire) == 1
