"""bench/own_task.py's arithmetic on hand-built metrics rows (no services): the
start figure is the step-0 eval, the final one the offline eval of the last checkpoint, the
curve runs against the trainer's minutes, and the run's config is what the bench changed."""

import json

import pytest

from bench.own_task import bench_config, finished_run, summarize
from relayrl.runtime.metrics import StepRecord

ROWS = [
    {"step": 0, "eval/heldout/pass@1": 0.05},
    {"step": 1, "time/elapsed_s": 60.0, "train/samples": 32, "train/reward_mean": 0.1},
    {"step": 2, "time/elapsed_s": 120.0, "train/samples": 32, "train/reward_mean": 0.3,
     "eval/heldout/pass@1": 0.2},
    {"step": 3, "time/elapsed_s": 240.0, "train/samples": 32, "train/reward_mean": 0.4},
]


def test_summary_takes_the_start_from_step_0_and_the_end_from_the_checkpoint():
    cfg = bench_config("examples/own_task.yaml", minutes=4)
    r = summarize("examples/own_task.yaml", cfg, [StepRecord.from_json(r) for r in ROWS],
                  {"eval/heldout/pass@1": 0.35})
    assert (r["start_pass@1"], r["final_pass@1"], r["gain_points"]) == (0.05, 0.35, 30.0)
    assert (r["steps"], r["samples"], r["minutes"]) == (3, 96, 4.0)
    assert r["samples_per_s"] == pytest.approx(96 / 240, abs=0.01)
    assert r["curve"] == [(0.0, 0.05), (2.0, 0.2), (4.0, 0.35)]


def test_the_wall_time_not_the_step_count_ends_a_bench_run():
    cfg = bench_config("examples/smollm2_calculator.yaml", minutes=30)
    assert cfg.trainer.max_steps == 1_000_000 and cfg.rollout.environment is not None
    assert cfg.run_dir.endswith("runs/bench_own_task/smollm2_calculator")


def test_resume_takes_a_run_that_trained_its_minutes_and_left_a_checkpoint(tmp_path):
    cfg = bench_config("examples/own_task.yaml", minutes=4).model_copy(
        update={"run_dir": str(tmp_path)})
    assert finished_run(cfg, 4) is None  # nothing there
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert finished_run(cfg, 4) is None  # trained its minutes, but left no checkpoint
    (tmp_path / "checkpoints" / "step_00000003").mkdir(parents=True)
    assert finished_run(cfg, 5) is None  # stopped before its minutes
    rows, checkpoint = finished_run(cfg, 4)
    assert checkpoint.name == "step_00000003"
    assert [r.to_json() for r in rows] == ROWS
