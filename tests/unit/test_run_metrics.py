"""A run's metrics files: throughput.png from metrics.jsonl (also one written before tokens/s
was recorded), read while the trainer appends to it, the trainer's plots drawn off its loop,
and TensorBoard scalars, refused by name when TensorBoard is not installed."""

import json
import sys

import pytest

from relayrl.runtime.metrics import (
    StepFigures,
    StepRecord,
    open_metrics,
    read_metrics,
    read_records,
)
from trainer_svc.plots import Plotter, plot_throughput


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("with_tokens", [True, False])
def test_throughput_plot_is_drawn(tmp_path, with_tokens):
    rows = [{"step": 0, "eval/accuracy_sampled": 0.3}]  # the eval before training
    for step in range(1, 81):
        row = {"step": step, "throughput/samples_per_s": 100 + step,
               "staleness/lag_mean": step % 3, "staleness/lag_max": 2}
        if with_tokens:
            row["throughput/tokens_per_s"] = 400 + step
        rows.append(row)
    write_rows(tmp_path / "metrics.jsonl", rows)
    plot_throughput(tmp_path / "metrics.jsonl", tmp_path / "throughput.png", "t")
    assert (tmp_path / "throughput.png").stat().st_size > 10_000
    assert not list(tmp_path.glob("*.tmp.png"))


def test_a_line_still_being_written_is_not_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_rows(path, [{"step": 1}, {"step": 2}])
    with open(path, "a") as f:
        f.write('{"step": 3, "train/rew')  # the trainer is mid-line
    assert read_metrics(path) == [{"step": 1}, {"step": 2}]


def test_the_plots_are_drawn_off_the_loop_and_a_failed_draw_stops_nothing(tmp_path, caplog):
    rows = [{"step": s, "train/reward_mean": s / 40, "throughput/samples_per_s": 100.0}
            for s in range(1, 41)]
    write_rows(tmp_path / "metrics.jsonl", rows)
    plots = Plotter(tmp_path / "metrics.jsonl", tmp_path, "t")
    plots.request()
    plots.request()  # still drawing (a fresh interpreter takes longer than this): skipped
    plots.close()  # waits for the requested draw, then draws the final picture
    assert (plots.draws, plots.failures) == (2, 0)
    for name in ("reward.png", "throughput.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    gone = Plotter(tmp_path / "metrics.jsonl", tmp_path / "no such dir", "t")
    gone.request()
    gone.close()  # no exception reaches the trainer
    assert gone.draws == 0 and gone.failures >= 1
    assert "could not draw the run's plots" in caplog.text


def test_tensorboard_missing_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    with pytest.raises(ValueError, match=r"trainer\.tensorboard is true.*tensorboard package"):
        open_metrics(tmp_path, tensorboard=True)
    open_metrics(tmp_path, tensorboard=False).close()  # off: never imported


def test_tensorboard_gets_every_number_of_a_record(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = open_metrics(tmp_path, tensorboard=True)
    for step in (1, 2):
        writer.write(StepRecord.from_json({"step": step, "train/reward_mean": 0.5 * step,
                                           "note": "text"}))
    writer.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert events.Tags()["scalars"] == ["train/reward_mean"]
    assert [(e.step, e.value) for e in events.Scalars("train/reward_mean")] == [(1, 0.5),
                                                                                (2, 1.0)]


def test_a_step_record_reads_back_as_written():
    record = StepRecord(7, StepFigures(samples=32, elapsed_s=1.5, reward_error_kinds={"raised": 2},
                                       env_error_kinds={"step_timeout_s": 1}),
                        {"eval/heldout/pass@1": 0.25, "staleness/samples_lag_0": 30})
    flat = record.to_json()
    assert flat == {"step": 7, "train/samples": 32, "time/elapsed_s": 1.5,
                    "errors/reward_error_kinds/raised": 2,
                    "errors/env_error_kinds/step_timeout_s": 1,
                    "eval/heldout/pass@1": 0.25, "staleness/samples_lag_0": 30}
    assert StepRecord.from_json(flat) == record


def test_an_extra_figure_cannot_shadow_a_named_one():
    with pytest.raises(AssertionError, match="train/samples"):
        StepRecord(1, StepFigures(samples=3), {"train/samples": 4}).to_json()


def test_updated_keeps_the_newest_value_of_each_figure():
    older = StepRecord(1, StepFigures(samples=8, accuracy_sampled=0.5), {"eval/a/pass@1": 0.5})
    newer = StepRecord(2, StepFigures(samples=4), {"staleness/samples_lag_0": 4})
    both = older.updated(newer)
    assert (both.step, both.figures.samples, both.figures.accuracy_sampled) == (2, 4, 0.5)
    assert both.extra == {"eval/a/pass@1": 0.5, "staleness/samples_lag_0": 4}


def test_records_are_read_typed(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "throughput/samples_per_s": 2.5, "train/custom": 1}\n')
    (record,) = read_records(path)
    assert record.figures.samples_per_s == 2.5 and record.extra == {"train/custom": 1}
