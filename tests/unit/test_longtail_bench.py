"""bench/longtail.py's accounting (no services): staleness from the trainer's histograms,
waste from the workers' closing lines."""

from bench.longtail import lag_counts, worker_waste
from relayrl.sim.accounting import distribution


def test_lags_come_from_the_trained_buckets_only():
    rows = [{"staleness/samples_lag_0": 6, "staleness/samples_lag_2": 2,
             "staleness/samples_lag_over": 8, "staleness/tokens_lag_1": 40},
            {"staleness/samples_lag_9plus": 1, "staleness/samples_lag_0": 1}]
    assert lag_counts(rows, "samples") == {0: 7, 2: 2, 9: 1}
    assert lag_counts(rows, "tokens") == {1: 40}
    assert distribution(lag_counts(rows, "samples"))["max"] == 9


def test_waste_is_read_from_the_line_the_worker_logs(tmp_path):
    from rollout_svc.worker import WASTE_LINE

    for name, figures in (("rollout-0.log", (3, 120, 45)), ("rollout-1.log", (0, 0, 5))):
        (tmp_path / name).write_text(f"noise\n{WASTE_LINE % figures}\n")
    (tmp_path / "trainer.log").write_text("waste: 9 groups restarted stale (9 tokens), 9\n")
    assert worker_waste(tmp_path) == (120, 50)
