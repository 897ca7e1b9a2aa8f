"""trainer.wandb: every number of a metrics record also goes to a W&B run; offline mode
writes the run under <run_dir>/wandb with no network, and a missing package is named."""

import sys

import pytest

from relayrl.config import RunConfig
from relayrl.runtime.metrics import StepRecord, open_run_metrics, read_metrics


def config(tmp_path, mode: str) -> RunConfig:
    return RunConfig.model_validate({"run_id": "wb", "run_dir": str(tmp_path / "run"),
                                     "trainer": {"wandb": {"mode": mode, "project": "p"}}})


def test_offline_mode_writes_its_run_directory(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_API_KEY", "")  # no login, no network: offline needs neither
    writer = open_run_metrics(config(tmp_path, "offline"))
    for step in (0, 1, 2):
        writer.write(StepRecord.from_json({"step": step, "train/reward_mean": 0.25 * step,
                                           "eval/heldout/pass@1": 0.5, "note": "text"}))
    writer.close()
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [0, 1, 2]
    (run,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    (log,) = run.glob("run-*.wandb")
    keys = (b"train/reward_mean", b"eval/heldout/pass@1", b"trainer/step")
    # finish() can return before W&B's service process has written the run's log (CI saw
    # only its header once): the log is whole once that process is shut down, as it is when
    # the trainer exits
    wandb.teardown()
    data = log.read_bytes()
    for key in keys:
        assert key in data


def test_disabled_mode_never_imports_wandb(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    writer = open_run_metrics(config(tmp_path, "disabled"))
    assert writer.wandb is None
    writer.close()


def test_missing_package_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ValueError, match=r"trainer\.wandb\.mode is 'offline'.*wandb package"):
        open_run_metrics(config(tmp_path, "offline"))
