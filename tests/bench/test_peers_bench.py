"""bench/peers.py's arithmetic and report on hand-built curves (no services, no TRL): the
levels lie on the way from the start to TRL's final accuracy, a level counts as reached on
the smoothed curve, medians over rounds, and the ratio is TRL's time over RelayRL's."""

import json
from pathlib import Path

import pytest

from bench.peers import bench_config
from bench.peers_report import Run, markdown, spread, summarize
from tests.conftest import SMALL_MODEL, SMALL_TASK

START = 0.2


def run(side: str, accs: list[float], every_s: float) -> Run:
    curve = [(0.0, START)] + [(every_s * (i + 1), a) for i, a in enumerate(accs)]
    return Run(side=side, curve=curve, steps=list(range(0, 50 * len(accs) + 1, 50)),
               samples=64 * 50 * len(accs), seconds=curve[-1][0])


def test_levels_run_from_the_start_to_trls_final_accuracy_and_ratios_compare_medians():
    trl = [run("trl", [0.4, 0.6, 0.6, 0.6, 0.6], every_s=10) for _ in range(3)]
    ours = [run("relayrl", [0.3, 0.4, 0.5, 0.6, 0.6, 0.6, 0.6], every_s=20) for _ in range(3)]
    report = summarize(trl + ours, START)
    assert report["levels"] == [0.4, 0.5, 0.56, 0.6]
    # TRL's trailing mean of 3: 0.2, 0.3, 0.4, 0.533, 0.6 at 0..40 s
    assert [t["median"] for t in report["sides"]["trl"]["time_to"]] == [20, 30, 40, 40]
    assert report["sides"]["trl"]["final_pass@1"] == pytest.approx(0.6)
    # ours: 0.2, 0.25, 0.3, 0.4, 0.5, 0.567, 0.6 at 0..120 s
    assert [t["median"] for t in report["sides"]["relayrl"]["time_to"]] == [60, 80, 100, 120]
    assert report["trl_over_relayrl"] == [0.33, 0.38, 0.4, 0.33]
    assert report["sides"]["trl"]["samples_per_s"] == pytest.approx(64 * 50 * 5 / 50)


def test_a_round_that_never_reaches_a_level_is_counted_not_dropped():
    assert spread([10.0, None, 30.0]) == {"median": 30.0, "min": 10.0, "max": None,
                                          "missed": 1}
    assert spread([None, None, 5.0])["median"] is None
    trl = [run("trl", [0.6, 0.6, 0.6], every_s=10)]
    flat = [run("relayrl", [0.2, 0.2, 0.2], every_s=10)]
    report = summarize(trl + flat, START)
    assert report["trl_over_relayrl"][-1] is None
    table = markdown(report, "tiny", "examples/tiny_cpu.yaml", "1.16.0",
                     "python bench/peers.py --rounds 1", "peers_tiny.png")
    assert "| relayrl | 0.200 |" in table and "not reached (1 rounds)" in table


def test_per_step_compares_the_saves_of_each_step_and_gives_the_gap_an_error():
    ours = [run("relayrl", [0.3, 0.5], every_s=5), run("relayrl", [0.5, 0.7], every_s=5)]
    trl = [run("trl", [0.4, 0.8, 0.9], every_s=10), run("trl", [0.6, 0.8, 0.9], every_s=10)]
    ps = summarize(ours + trl, START)["per_step"]
    assert ps["steps"] == [50, 100]  # TRL's third save has no RelayRL counterpart
    assert ps["rounds"] == {"relayrl": [[0.3, 0.5], [0.5, 0.7]], "trl": [[0.4, 0.8], [0.6, 0.8]]}
    # round means 0.4, 0.6 against 0.6, 0.7: gap -0.15, se sqrt(0.02 / 2 + 0.005 / 2)
    assert ps["gap"] == pytest.approx(-0.15)
    assert ps["gap_se"] == pytest.approx(0.1118, abs=1e-4)
    table = markdown(summarize(ours + trl, START), "tiny", "c.yaml", "1.16.0", "cmd", "p.png")
    assert "| relayrl | 0.40 (0.30 / 0.50) | 0.60 (0.50 / 0.70) |" in table
    assert "RelayRL minus TRL: -0.150 +- 0.112" in table
    one = summarize([ours[0], trl[0]], START)["per_step"]
    assert one["gap_se"] is None


def test_runs_without_a_common_save_have_no_per_step_gap():
    ours = Run(side="relayrl", curve=[(0.0, START), (5.0, 0.5)], steps=[0, 30], samples=64,
               seconds=5.0)
    trl = run("trl", [0.4, 0.8], every_s=10)
    report = summarize([ours, trl], START)
    assert report["per_step"]["steps"] == [] and report["per_step"]["gap"] is None
    assert "## Per step" not in markdown(report, "tiny", "c.yaml", "1.16.0", "cmd", "p.png")


def test_both_sides_are_needed():
    with pytest.raises(ValueError, match="both sides"):
        summarize([run("trl", [0.5], every_s=1)], START)


def test_the_bench_saves_every_n_steps_and_leaves_evaluation_to_afterwards(tmp_path):
    cfg = bench_config("examples/tiny_cpu.yaml", steps=100, every=25, run_dir=tmp_path)
    assert (cfg.trainer.max_steps, cfg.trainer.checkpoint.every) == (100, 25)
    assert cfg.trainer.checkpoint.keep >= 100 // 25 and cfg.eval.every == 0


def test_each_round_starts_from_an_empty_run_dir(tmp_path):
    """A checkpoint left by an earlier bench would be resumed: the round would train nothing."""
    old = tmp_path / "checkpoints" / "step_1200"
    old.mkdir(parents=True)
    cfg = bench_config("examples/tiny_cpu.yaml", steps=100, every=25, run_dir=tmp_path)
    assert Path(cfg.run_dir) == tmp_path and not old.exists()


def test_rounds_are_seeded_apart_and_trl_gets_the_rounds_seed(tmp_path):
    """Rounds on one seed replay one trajectory: their spread would say nothing."""
    from bench.peers import trl_spec

    # the session's small model (tests/conftest.py), not the example's: its warm start is
    # built in seconds, and trl_spec only needs a model to exist
    small = ([f"model.{k}={v}" for k, v in SMALL_MODEL.items()]
             + [f"task.{k}={v}" for k, v in SMALL_TASK.items()])
    cfgs = [bench_config("examples/tiny_cpu.yaml", steps=100, every=25,
                         run_dir=tmp_path / str(r), round_=r, eval_samples=4, overrides=small)
            for r in (0, 1)]
    assert cfgs[0].trainer.seed != cfgs[1].trainer.seed
    assert cfgs[0].rollout.seed != cfgs[1].rollout.seed
    assert all(s.samples == 4 for s in cfgs[1].eval.sets)
    spec = json.loads(trl_spec(cfgs[1], 100, 25, tmp_path / "work", 1).read_text())
    assert spec["seed"] == cfgs[1].trainer.seed


def test_set_changes_relayrls_side_only_where_trl_has_no_counterpart(tmp_path, capsys):
    from bench.peers import main

    cfg = bench_config("examples/smollm2_cpu.yaml", 12, 4, tmp_path / "r", 0, 1,
                       ["scheduler.max_inflight_prompts=6"])
    assert cfg.scheduler.max_inflight_prompts == 6
    for shared in ("trainer.optimizer.lr=0.1", "buffer.groups_per_batch=2",
                   "rollout.temperature=0.5"):
        with pytest.raises(SystemExit):
            main(["--setup", "smollm2", "--set", shared])
        assert "both sides share that setting" in capsys.readouterr().err


def test_merged_rounds_must_share_the_settings_and_not_repeat_a_round(tmp_path, capsys):
    from bench.peers import main

    rounds = tmp_path / "peers_smollm2_rounds.json"
    ran = {"setup": "smollm2", "steps": 30, "every": 5, "overrides": []}
    rounds.write_text(json.dumps({**ran, "start": START, "runs": [
        {"round": 0, **vars(run("trl", [0.5], every_s=1))}]}))
    with pytest.raises(SystemExit):
        main(["--setup", "smollm2", "--merge", str(rounds)])
    assert "rounds [0] are in --merge already" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--setup", "smollm2", "--steps", "20", "--first-round", "1", "--merge",
              str(rounds)])
    assert "its rounds ran" in capsys.readouterr().err


def test_past_the_level_step_a_late_round_is_timed_and_levels_stay_trls_at_that_step():
    """Both sides ran 2 saves past step 150: TRL's level is its mean over saves up to 150
    (0.5), a side that gets there only at step 200 is timed there, not missed."""
    trl = [run("trl", [0.5, 0.5, 0.5, 0.9, 0.9], every_s=10) for _ in range(3)]
    late = [run("relayrl", [0.3, 0.4, 0.4, 0.6, 0.6], every_s=8) for _ in range(3)]
    report = summarize(trl + late, START, until=150)
    assert report["levels"][-1] == pytest.approx(0.5) and report["level_step"] == 150
    assert report["sides"]["trl"]["final_pass@1"] == pytest.approx(0.5)
    # RelayRL's trailing mean of 3: 0.3, 0.367, 0.467, 0.533 at 16..40 s
    assert report["sides"]["relayrl"]["time_to"][-1]["median"] == 40
    # without a level step, the last 3 saves: 0.5, 0.9, 0.9
    assert summarize(trl + late, START)["levels"][-1] == pytest.approx(0.7667)
    assert "up to step 150" in markdown(report, "tiny", "c.yaml", "1.16.0", "cmd", "p.png")
