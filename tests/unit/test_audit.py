"""The ledger reconciliation on hand-built books."""

import pytest

from relayrl.contracts.keys import EXTERNAL_PROMPT_BASE
from relayrl_ops.audit import reconcile

EXT = EXTERNAL_PROMPT_BASE


def books(**sets):
    base = {name: set() for name in ("leased", "failed", "batched", "consumed", "dropped")}
    base.update({k: set(v) for k, v in sets.items()})
    return base


def test_a_finished_run_balances_and_is_counted_by_stage():
    sets = books(leased=range(10), failed={9}, batched={0, 1, 2, 3, 4, 5, 6, 7, EXT},
                 consumed={0, 1, 2, 3, 4, EXT}, dropped={5, 6})
    report = reconcile(sets, trainer_finished=7, run_finished=True)
    assert report.balanced, report.render()
    c = report.counts
    # 10 leased: 1 failed, 8 assembled of which 5 trained, 2 dropped and 1 awaits the trainer;
    # prompt 8 is neither failed nor assembled: still out
    assert (c["leased"], c["failed"], c["batched"]) == (10, 1, 8)
    assert (c["trained"], c["dropped"], c["awaiting_trainer"], c["in_flight"]) == (5, 2, 1, 1)
    assert (c["external_batched"], c["external_trained"]) == (1, 1)


def test_a_group_trained_twice_shows_in_the_count_not_the_sets():
    sets = books(leased={0, 1}, batched={0, 1}, consumed={0, 1})
    assert not reconcile(sets, trainer_finished=3, run_finished=True).balanced
    # mid-run the trainer's count runs ahead of what its checkpoints have made durable
    assert reconcile(sets, trainer_finished=3, run_finished=False).balanced
    assert not reconcile(sets, trainer_finished=1, run_finished=False).balanced


@pytest.mark.parametrize("sets,broken", [
    (books(leased={0}, batched={0}, consumed={0}, dropped={0}), "both trained and dropped"),
    (books(leased={0, 1}, batched={0}, consumed={0, 1}), "assembled first"),
    (books(leased={0}, batched={0, 1}), "was leased"),
    (books(leased={0}, failed={0}, batched={0}), "failed and assembled"),
    (books(batched={EXT}, consumed={EXT}, dropped={EXT}), "both trained and dropped"),
])
def test_each_imbalance_fails_its_own_check_and_names_the_prompts(sets, broken):
    report = reconcile(sets, trainer_finished=len(sets["consumed"] | sets["dropped"]),
                       run_finished=False)
    failing = [c.what for c in report.checks if not c.ok]
    assert len(failing) == 1 and broken in failing[0], failing
    assert "books do NOT balance" in report.render()


def test_missing_sets_are_named():
    with pytest.raises(ValueError, match="consumed"):
        reconcile({"leased": set(), "failed": set(), "batched": set(), "dropped": set()}, 0,
                  True)


def test_quarantined_groups_are_dropped_in_the_books_and_reported_beside_them():
    # prompt 2's group was poison (a token past the vocabulary): the trainer finished it as
    # dropped and recorded the entry in its quarantine
    sets = books(leased={0, 1, 2}, batched={0, 1, 2}, consumed={0, 1}, dropped={2})
    record = {"entry": "1700000000000-0", "kind": "poison", "prompt_ids": [2], "step": 3,
              "batch_id": "b7",
              "reason": "prompt 2 samples[0].response_tokens: token id 1000 is past the "
                        "vocabulary of the trainer's model (15 tokens)"}
    report = reconcile(sets, trainer_finished=3, run_finished=True,
                       quarantined={"1700000000000-0:poison": record})
    assert report.balanced, report.render()
    assert report.counts["quarantined_entries"] == 1
    assert report.counts["awaiting_trainer"] == 0
    assert "token id 1000" in report.render()
    assert report.to_dict()["quarantined"] == {"1700000000000-0:poison": record}
