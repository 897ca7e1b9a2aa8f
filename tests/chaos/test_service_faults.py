"""The real stack under a seeded schedule that kills (-9) one process of every kind in turn
(relay, buffer, scheduler, trainer, embedded Redis, a rollout worker); the launcher restarts
each. The run must reach its last step with the books balanced: nothing lost, nothing
trained twice. `python bench/faults.py` runs a longer schedule and writes the table."""

import pytest

from relayrl.config import RunConfig
from relayrl_testkit.fault_run import fault_settings, run_with_faults
from relayrl_testkit.fault_schedule import KINDS, draw_schedule, steps_needed
from tests.conftest import small_stack_config

SEED, ROUNDS, WORKERS, STEPS_PER_RESTART = 0, 1, 2, 20


@pytest.fixture(scope="module")
def faulted_run(tmp_path_factory):
    schedule = draw_schedule(SEED, ROUNDS, WORKERS)
    steps = steps_needed(schedule, STEPS_PER_RESTART)
    data = small_stack_config(tmp_path_factory.mktemp("faults"), steps=steps)
    data["rollout"].update(num_workers=WORKERS, max_new_tokens=8, segment_tokens=4)
    for section, fields in fault_settings(ROUNDS).items():
        data.setdefault(section, {}).update(fields)
    return schedule, run_with_faults(RunConfig.model_validate(data), schedule, STEPS_PER_RESTART)


def test_every_kind_was_killed_once_and_recovered(faulted_run):
    schedule, result = faulted_run
    assert result.injector_error is None
    assert [o.fault.kind for o in result.outcomes] == list(KINDS)
    assert [o.fault for o in result.outcomes] == schedule
    assert all(o.recovery_s is not None for o in result.outcomes), result.outcomes


def test_the_run_reached_its_target_step(faulted_run):
    _, result = faulted_run
    assert result.exit_code == 0
    assert result.final_step == result.max_steps


def test_the_books_balance_nothing_lost_nothing_trained_twice(faulted_run):
    _, result = faulted_run
    assert result.audit.balanced, result.audit.render()
    assert result.lost == 0, result.audit.render()
    assert result.trained_twice == 0, result.audit.render()
    assert result.audit.counts["failed"] == 0, result.audit.render()
