"""The repacking rule on hand-built loads, and the lease policy that applies it."""

import pytest

from relayrl.rules.repack import Move, is_tail, plan_moves, rank_targets
from scheduler_svc.policy import LeasePolicy


def test_a_tail_is_some_but_few_sequences():
    assert [is_tail(n, 16, 0.25) for n in (0, 1, 4, 5)] == [False, True, True, False]


def test_targets_are_fuller_workers_with_room_fullest_first():
    loads = {"a": 3, "b": 10, "c": 16, "d": 7, "e": 3}
    # c is full; a is the source; e has the same load but a later id, so it ranks above a
    assert rank_targets("a", 3, loads, 16) == ["b", "d", "e"]
    assert rank_targets("e", 3, loads, 16) == ["b", "d"]  # a ties with e but sorts below it


def test_tails_consolidate_onto_the_fullest_worker_that_fits():
    holdings = {"w0": [("L1", 8), ("L2", 4)],  # 12 of 16: not a tail
                "w1": [("L3", 2)],  # tail
                "w2": [("L4", 3), ("L5", 1)],  # tail
                "w3": []}
    moves = plan_moves(holdings, capacity=16, repack_below=0.25)
    # w1 (lightest) first: L3 -> w0 (12 -> 14). w2: L4 (3) no longer fits w0 (14 + 3 > 16);
    # its only other fuller candidate is w1, emptied by then; L5 (1) fits w0 (14 -> 15).
    assert moves == [Move("L3", 2, "w1", "w0"), Move("L5", 1, "w2", "w0")]


def test_a_worker_that_received_is_not_emptied_and_nobody_moves_onto_an_empty_one():
    holdings = {"a": [("x", 1)], "b": [("y", 2)], "c": []}
    # a -> b (b fuller); b then received, so it stays; c is empty and never a target
    assert plan_moves(holdings, 16, 0.25) == [Move("x", 1, "a", "b")]


def test_only_allowed_targets_receive():
    holdings = {"a": [("x", 1)], "b": [("y", 2)]}
    assert plan_moves(holdings, 16, 0.25, targets_only=["a"]) == []


def test_nothing_to_do_when_every_worker_is_busy_enough():
    assert plan_moves({"a": [("x", 8)], "b": [("y", 9)]}, 16, 0.25) == []


@pytest.mark.parametrize("kw", [dict(capacity=0, repack_below=0.5),
                                dict(capacity=4, repack_below=0.0),
                                dict(capacity=4, repack_below=1.5)])
def test_bad_parameters_are_named(kw):
    with pytest.raises(ValueError, match="capacity|repack_below"):
        plan_moves({}, **kw)


def _policy(**kw):
    args = dict(lease_ttl_s=10.0, max_attempts=2, max_inflight=3, group_size=4,
                worker_capacity=8, repack_below=0.25)
    args.update(kw)
    return LeasePolicy(**args)


def _fill(p):
    for w in ("w0", "w1"):
        p.register(w, now=0.0)
    big = p.acquire("w0", 2, now=0.0)
    small = p.acquire("w1", 1, now=0.0)[0]
    for g in big:
        p.note_progress(g.lease_id, "w0", 3)  # 6 of 8 seats
    p.note_progress(small.lease_id, "w1", 2)  # 2 of 8: a tail
    return big, small


def test_policy_plans_only_when_no_prompt_waits_unless_forced():
    p = _policy(max_inflight=4)
    _, small = _fill(p)
    assert p.plan_repack(now=1.0) == []  # a 4th prompt may still be handed out
    assert [m.item for m in p.plan_repack(now=1.0, force=True)] == [small.lease_id]


def test_policy_recall_reservation_and_hand_over():
    p = _policy()
    _, small = _fill(p)
    assert [(m.source, m.target) for m in p.plan_repack(now=1.0)] == [("w1", "w0")]
    assert p.note_progress(small.lease_id, "w1", 2) is True  # recalled
    assert p.note_progress(small.lease_id, "w0", 2) is None  # not w0's
    assert p.release(small.lease_id, "w1", now=2.0)
    assert p.acquire("w1", 1, now=2.0) == []
    grant = p.acquire("w0", 1, now=2.0)[0]
    assert grant.prompt_id == small.prompt_id and grant.attempt == 1
    assert p.counters.leases_moved == 1 and p.reserved == {}


def test_draining_and_silent_workers_receive_nothing():
    p = _policy()
    _fill(p)
    p.drain("w0", lapse_leases=False, now=1.0)
    assert p.plan_repack(now=1.0) == []
    p.undrain("w0")
    p.heartbeat("w1", 0, now=9.0)  # w0 last seen at 0: silent for a whole TTL by 10.5
    assert p.plan_repack(now=10.5) == []


def test_repacking_is_off_without_a_capacity():
    p = _policy(worker_capacity=0)
    _fill(p)
    assert p.plan_repack(now=1.0, force=True) == []
