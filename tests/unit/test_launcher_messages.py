"""How the launcher says a service ended: an exit code as it is, a signal by name, and a
SIGKILL with where it most likely came from (the kernel's out-of-memory killer); and how
long it lets a stopping trainer finish its step."""

import signal

from relayrl_ops.launcher import ended_by


def test_an_exit_code_is_said_as_it_is():
    assert ended_by(2) == "exited with code 2"
    assert ended_by(0) == "exited with code 0"


def test_a_signal_is_named():
    assert ended_by(-signal.SIGTERM) == "was killed by SIGTERM"
    assert ended_by(-200) == "was killed by signal 200"


def test_a_sigkill_points_at_the_memory_plan():
    said = ended_by(-signal.SIGKILL)
    assert said.startswith("was killed by SIGKILL")
    assert "out-of-memory" in said and "relayrl check" in said


def test_a_stopping_trainer_gets_twice_its_longest_recent_step(tmp_path):
    """The trainer finishes the step under way before it checkpoints and exits, so a run
    with 30 s steps is not killed after the launcher's usual 15 s."""
    from relayrl.runtime.metrics import MetricsWriter, StepRecord
    from relayrl_ops.launcher import trainer_stop_grace_s

    metrics = tmp_path / "metrics.jsonl"
    assert trainer_stop_grace_s(metrics, 15.0) == 15.0  # no step yet
    writer = MetricsWriter(metrics)
    for step, seconds in enumerate([80.0, 20.0, 30.0, None], start=1):  # None: an eval record
        record = StepRecord(step)
        record.figures.step_s = seconds
        writer.write(record)
    writer.close()
    assert trainer_stop_grace_s(metrics, 15.0) == 15.0 + 2 * 80.0
    assert trainer_stop_grace_s(metrics, 15.0, recent=2) == 15.0 + 2 * 30.0


def test_an_unreadable_metrics_file_leaves_the_usual_grace(tmp_path):
    """A stop never fails on the metrics file: a line that is not JSON gives the floor."""
    from relayrl_ops.launcher import trainer_stop_grace_s

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "time/step_s": 30.0}\nnot json\n')
    assert trainer_stop_grace_s(metrics, 15.0) == 15.0
