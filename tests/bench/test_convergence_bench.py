"""The learning-quality study's arithmetic and report on hand-built numbers (no services)."""

import json
import shutil
from pathlib import Path

import pytest

import bench.convergence as convergence
from bench.convergence import Mode, mode_config, parse_args, run_once, study_modes
from bench.convergence_curves import (
    ModeSummary,
    RunCurve,
    compare,
    fill_gaps,
    final_mean,
    first_reach,
    points_scale,
    reach_level,
    run_curve,
    seed_mean,
    summarize,
    trailing_mean,
)
from bench.convergence_report import StudySettings, render_markdown, table_rows
from relayrl.config import load_run_config
from relayrl.runtime.metrics import StepRecord


def _run(reward, wall, evals=(), lag=0.0, dropped=0):
    return RunCurve(reward=list(reward), wall_s=list(wall), evals=list(evals), lag_mean=lag,
                    groups_trained=8 * len(reward), groups_dropped_stale=dropped,
                    samples_trained=64 * len(reward))


def _summary(mode, staleness, correction, final, reach, wall=100.0, heldout=0.7):
    return ModeSummary(mode=mode, staleness=staleness, correction=correction, seeds=2,
                       final_reward=final, final_reward_std=0.01, final_reward_se=0.003,
                       wall_s=wall, reach_s=reach, samples_per_s=200.0,
                       lag_mean=staleness / 2, groups_dropped_stale=1.5, groups_total=800.0,
                       heldout=heldout, heldout_se=0.004)


def test_trailing_mean_looks_back_only():
    assert trailing_mean([1, 2, 3, 4, 5], 2) == [1, 1.5, 2.5, 3.5, 4.5]
    assert trailing_mean([1, 2, 3, 4], 3) == [1, 1.5, 2, 3]
    assert trailing_mean([0.5, 0.7], 1) == [0.5, 0.7]
    with pytest.raises(ValueError):
        trailing_mean([1.0], 0)


def test_fill_gaps_repeats_the_last_value():
    assert fill_gaps([None, 0.2, None, 0.4, None]) == [0.2, 0.2, 0.2, 0.4, 0.4]
    with pytest.raises(ValueError, match="no step has a training reward"):
        fill_gaps([None, None])


def test_final_mean_is_over_the_last_tenth():
    values = [0.0] * 18 + [0.5, 0.7]
    assert final_mean(values) == pytest.approx(0.6)
    assert final_mean(list(range(21))) == pytest.approx((18 + 19 + 20) / 3)  # ceil(2.1) = 3
    assert final_mean([0.3]) == 0.3


def test_first_reach_is_the_first_time_at_or_above():
    times = [10.0, 20.0, 30.0, 40.0]
    assert first_reach(times, [0.1, 0.5, 0.4, 0.9], 0.5) == 20.0
    assert first_reach(times, [0.1, 0.2, 0.3, 0.4], 0.5) is None
    assert first_reach(times, [0.6, 0.2, 0.3, 0.4], 0.5) == 10.0


def test_points_scale():
    assert points_scale([0.0, 0.5, 1.0]) == 100.0
    assert points_scale([0.0, 1.5]) == 1.0
    assert reach_level(0.74, 100.0) == pytest.approx(0.72)
    assert reach_level(5.0, 1.0) == pytest.approx(3.0)


def test_run_curve_from_metrics_rows():
    rows = [
        {"step": 0, "eval/accuracy_sampled": 0.4},
        {"step": 1, "time/elapsed_s": 30.0, "time/step_s": 0.5, "train/reward_mean": 0.4,
         "train/groups": 8, "train/samples": 64, "train/groups_dropped_stale": 0,
         "staleness/lag_mean": 0.0},
        {"step": 2, "time/elapsed_s": 31.0, "time/step_s": 0.5, "train/groups": 0,
         "train/groups_dropped_stale": 8},  # every group stale: nothing trained
        {"step": 3, "time/elapsed_s": 32.5, "time/step_s": 0.5, "train/reward_mean": 0.6,
         "train/groups": 8, "train/samples": 64, "train/groups_dropped_stale": 0,
         "staleness/lag_mean": 1.0, "eval/accuracy_sampled": 0.5},
    ]
    run = run_curve([StepRecord.from_json(r) for r in rows])
    assert run.reward == [0.4, 0.4, 0.6]
    assert run.wall_s == pytest.approx([0.5, 1.5, 3.0])  # from the start of the first step
    assert run.evals == [(0, 0.4), (3, 0.5)]
    assert run.lag_mean == 0.5
    assert (run.groups_trained, run.groups_dropped_stale) == (16, 8)
    assert run.samples_per_s == pytest.approx(128 / 3.0)


def test_seed_mean_and_summary():
    a = _run([0.2, 0.4, 0.6, 0.8], [1, 2, 3, 4], evals=[(0, 0.1), (2, 0.5), (4, 0.7)],
             lag=1.0, dropped=2)
    b = _run([0.4, 0.6, 0.8, 1.0, 1.0], [3, 4, 5, 6, 7], evals=[(0, 0.1), (4, 0.8)], lag=2.0)
    curve = seed_mean([a, b], window=2)
    assert curve.steps == [1, 2, 3, 4]  # up to the shortest run
    assert curve.reward == pytest.approx([0.3, 0.4, 0.6, 0.8])
    assert curve.reward_std == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert curve.wall_s == pytest.approx([2, 3, 4, 5])
    summary = summarize("async_2_tis_token", 2, "tis_token", [a, b], curve, level=0.55)
    assert summary.final_reward == pytest.approx((0.8 + 1.0) / 2)
    assert summary.final_reward_std == pytest.approx(0.1)
    assert summary.final_reward_se == pytest.approx(0.1)  # stdev 0.1414 over sqrt(2)
    assert summary.reach_s == 4  # the seed mean first reaches 0.55 at step 3
    assert summary.wall_s == pytest.approx(5.5)
    # a run's last evaluations after step 0 (a's two, b's one), then the seeds' mean
    assert summary.heldout == pytest.approx((0.6 + 0.8) / 2)
    assert summary.heldout_se == pytest.approx(0.1)
    assert (summary.lag_mean, summary.groups_dropped_stale) == (1.5, 1.0)
    assert summarize("sync", 0, "tis_token", [a], curve, level=None).reach_s is None


def test_compare_against_sync():
    sync = _summary("sync", 0, "tis_token", 0.74, reach=200.0)
    fast = compare(_summary("async_2_tis_token", 2, "tis_token", 0.73, 90.0), sync, 100.0)
    assert fast.delta_points == pytest.approx(-1.0)
    assert fast.delta_se_points == pytest.approx(0.3 * 2 ** 0.5)
    assert fast.learns_as_well and fast.heldout_as_well
    assert fast.heldout_delta_points == pytest.approx(0.0)
    assert fast.wall_ratio == pytest.approx(0.45)
    assert fast.meets_target
    slow = compare(_summary("async_1_tis_token", 1, "tis_token", 0.75, 120.0), sync, 100.0)
    assert slow.wall_ratio == pytest.approx(0.6) and not slow.meets_target
    uncorrected = compare(_summary("async_2_none", 2, "none", 0.74, 50.0), sync, 100.0)
    assert not uncorrected.meets_target  # the target is about corrected training
    never = compare(_summary("async_8_none", 8, "none", 0.5, None), sync, 100.0)
    assert never.wall_ratio is None and never.delta_points == pytest.approx(-24.0)
    assert not never.learns_as_well
    worse = compare(_summary("async_4_tis_token", 4, "tis_token", 0.75, 90.0, heldout=0.67),
                    sync, 100.0)
    assert worse.learns_as_well and not worse.heldout_as_well  # 3 points below on held-out
    assert worse.heldout_delta_points == pytest.approx(-3.0)


def test_table_and_report():
    sync = _summary("sync", 0, "tis_token", 0.74, reach=200.0, wall=250.0)
    fast = _summary("async_2_tis_token", 2, "tis_token", 0.73, 90.0, wall=150.0)
    never = _summary("async_8_none", 8, "none", 0.5, None)
    comparisons = {s.mode: compare(s, sync, 100.0) for s in (fast, never)}
    rows = table_rows([sync, fast, never], comparisons)
    assert len(rows) == 5
    assert all(r.count("|") == rows[0].count("|") for r in rows)
    assert rows[2] == ("| sync | 0 | tis_token | 0.740 ± 0.010 | – | 0.700 | – | 200 s | – "
                       "| 250 s | 200.0 | 0.00 | 1.5 of 800 (0.2%) |")
    assert "| -1.0 ± 0.4 | 0.700 | +0.0 ± 0.6 | 90 s | **0.45** | 150 s |" in rows[3]
    assert "| -24.0 ± 0.4 | 0.700 | +0.0 ± 0.6 | never | – |" in rows[4]
    settings = StudySettings(command="python bench/convergence.py --seeds 2", config="x.yaml",
                             steps=100, groups_per_batch=8, group_size=8, seeds=2,
                             smooth_window=5, points_scale=100.0)
    text = render_markdown(settings, [sync, fast, never], comparisons, "convergence.png")
    assert "**Met** by async_2_tis_token." in text
    # the uncorrected mode is judged by neither measure
    assert ("by final training reward, async_2_tis_token; by held-out accuracy, "
            "async_2_tis_token." in text)
    assert "`python bench/convergence.py --seeds 2`" in text
    assert "trailing mean over 5 steps" in text and "![" in text
    assert "**Not met**" in render_markdown(settings, [sync, never],
                                            {"async_8_none": comparisons["async_8_none"]}, "p")


def test_modes_and_their_config_edits(tmp_path):
    modes = study_modes([1, 2], ["tis_token", "none"], "tis_token", ["sync", "async_2_*"])
    assert [m.name for m in modes] == ["sync", "async_2_tis_token", "async_2_none"]
    with pytest.raises(ValueError, match="--modes"):
        study_modes([1], ["none"], "tis_token", ["async_4_*"])
    capped = study_modes([3], ["tis_token"], "tis_token", ["*"], inflight=(2, 0))
    assert [m.name for m in capped] == ["sync", "async_3_in2_tis_token", "async_3_tis_token"]
    for example in ("examples/tiny_cpu.yaml", "examples/smollm2_cpu.yaml"):
        base = load_run_config(example)
        groups = base.buffer.groups_per_batch
        sync = mode_config(base, Mode("sync", 0, "tis_token"), 1, 20, None, tmp_path / "s")
        assert sync.trainer.max_staleness == 0 and sync.inflight_limit == groups
        assert sync.eval.every == base.eval.every
        stale = mode_config(base, Mode("async_4_none", 4, "none"), 2, 20, 5, tmp_path / "a")
        assert (stale.trainer.max_staleness, stale.trainer.loss.correction) == (4, "none")
        assert stale.inflight_limit == 4 * groups and stale.trainer.max_steps == 20
        assert stale.trainer.seed == base.trainer.seed + 2
        assert stale.rollout.seed != sync.rollout.seed
        assert stale.task == base.task and stale.model == base.model  # same starting point
        two_out = mode_config(base, capped[1], 0, 20, None, tmp_path / "c")
        assert (two_out.trainer.max_staleness, two_out.inflight_limit) == (3, 2 * groups)
    half = study_modes([3], ["tis_token"], "tis_token", ["async_*"], inflight=(2.5,))[0]
    assert half.name == "async_3_in2.5_tis_token"
    tiny = load_run_config("examples/tiny_cpu.yaml")  # 8 prompts a batch: 2.5 batches is 20
    assert mode_config(tiny, half, 0, 20, None, tmp_path / "h").inflight_limit == 20


def test_each_config_gets_its_own_outputs():
    tiny = parse_args([])
    assert (tiny.name, tiny.runs_dir.name, str(tiny.out)) == ("convergence", "convergence",
                                                              "docs/results")
    assert tiny.staleness == [1, 2, 4, 8] and tiny.seeds == 3
    smol = parse_args(["--config", "examples/smollm2_cpu.yaml", "--staleness", "2"])
    assert smol.name == smol.runs_dir.name == "convergence_smollm2_cpu"
    smoke = parse_args(["--smoke"])
    assert "convergence_smoke" in str(smoke.out) and smoke.steps < 20
    with pytest.raises(ValueError, match="--staleness"):
        parse_args(["--staleness", "0,2"])
    assert parse_args(["--inflight", "0,2.5"]).inflight == (0, 2.5)
    for bad in ("-1", "0.5", "two", "inf", "nan"):
        with pytest.raises(ValueError, match="--inflight"):
            parse_args(["--inflight", bad])


def test_a_finished_run_is_reused_where_it_moved_and_survives_a_killed_rerun(tmp_path,
                                                                             monkeypatch):
    base = load_run_config("examples/tiny_cpu.yaml")
    launched = []

    def fake_stack(cfg):  # stands in for the services: writes what the trainer writes
        launched.append(cfg.run_dir)
        rows = [{"step": s, "time/elapsed_s": float(s), "train/reward_mean": 0.5,
                 "train/groups": 8, "train/samples": 64} for s in (1, 2)]
        Path(cfg.run_dir, "metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
        return [StepRecord.from_json(r) for r in rows]

    monkeypatch.setattr(convergence, "run_stack", fake_stack)
    cfg = mode_config(base, Mode("sync", 0, "tis_token"), 0, 2, None, tmp_path / "a" / "sync-s0")
    assert run_once(cfg, fresh=False)[1] is False
    assert launched == [str(tmp_path / "a" / "sync-s0.partial")]  # made aside, then moved in
    assert not (tmp_path / "a" / "sync-s0.partial").exists()
    shutil.move(tmp_path / "a", tmp_path / "b")  # the study renamed
    moved = mode_config(base, Mode("sync", 0, "tis_token"), 0, 2, None, tmp_path / "b" / "sync-s0")
    assert run_once(moved, fresh=False)[1] is True and len(launched) == 1
    spec_path = tmp_path / "b" / "sync-s0" / "bench_spec.json"  # as written before the key
    spec_path.write_text(json.dumps({**json.loads(spec_path.read_text()), "run_dir": "old"}))
    assert run_once(moved, fresh=False)[1] is True and len(launched) == 1

    def killed(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(convergence, "run_stack", killed)
    with pytest.raises(KeyboardInterrupt):
        run_once(moved, fresh=True)
    assert run_once(moved, fresh=False)[1] is True  # the finished run is still there
    longer = mode_config(base, Mode("sync", 0, "tis_token"), 0, 3, None, tmp_path / "b" / "sync-s0")
    with pytest.raises(KeyboardInterrupt):  # other settings: not reused
        run_once(longer, fresh=False)
