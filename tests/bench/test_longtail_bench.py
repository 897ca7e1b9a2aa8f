"""bench/longtail.py's accounting (no services): staleness from the trainer's histograms,
waste from the workers' closing lines."""

from bench.longtail import lag_counts, worker_waste
from relayrl.runtime.metrics import StepRecord
from relayrl_sim.accounting import distribution


def test_lags_come_from_the_trained_buckets_only():
    rows = [StepRecord.from_json(r) for r in (
        {"staleness/samples_lag_0": 6, "staleness/samples_lag_2": 2,
         "staleness/samples_lag_over": 8, "staleness/tokens_lag_1": 40},
        {"staleness/samples_lag_9plus": 1, "staleness/samples_lag_0": 1})]
    assert lag_counts(rows, "samples") == {0: 7, 2: 2, 9: 1}
    assert lag_counts(rows, "tokens") == {1: 40}
    assert distribution(lag_counts(rows, "samples"))["max"] == 9


def test_waste_is_read_from_the_line_the_worker_logs(tmp_path):
    from rollout_svc.worker import WASTE_LINE

    for name, figures in (("rollout-0.log", (3, 120, 45)), ("rollout-1.log", (0, 0, 5))):
        (tmp_path / name).write_text(f"noise\n{WASTE_LINE % figures}\n")
    (tmp_path / "trainer.log").write_text("waste: 9 groups restarted stale (9 tokens), 9\n")
    assert worker_waste(tmp_path) == (120, 50)


def test_sync_is_a_barrier_and_async_keeps_the_bound(tmp_path):
    from types import SimpleNamespace

    from bench.longtail import mode_config
    from relayrl.config import load_run_config

    base = load_run_config("examples/tiny_cpu.yaml")
    args = SimpleNamespace(groups=8, workers=2, staleness=3, inflight=0, steps=10,
                           max_tokens=64, median=16, p99_ratio=10.0, segment=16)
    sync = mode_config(base, "sync", tmp_path / "s", args)
    # a bound above 0 would let the next batch start on the step's old weights (lag 1)
    assert (sync.trainer.max_staleness, sync.inflight_limit) == (0, 8)
    repack = mode_config(base, "async_repack", tmp_path / "r", args)
    assert (repack.trainer.max_staleness, repack.inflight_limit) == (3, 24)
    assert repack.scheduler.repack and not sync.scheduler.repack
