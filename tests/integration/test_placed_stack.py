"""A placed run through `relayrl up` (resources): the trainer, given two GPUs, runs as two
torchrun ranks (gloo where there is no CUDA) and trains the run to its end with one rollout
worker; the books balance. What each process is given is checked process by process in
tests/unit/test_plan.py."""

import pytest

from relayrl.config import RunConfig
from relayrl.runtime.metrics import read_metrics
from relayrl_ops.launcher import Launcher
from tests.conftest import free_ports, small_stack_config, snapshot

STEPS = 3


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("placed")
    data = small_stack_config(tmp, steps=STEPS)
    data["rollout"].update(num_workers=1)
    data["scheduler"].update(start_after_workers=1)
    data["eval"] = {"every": 0}  # under torchrun the trainer evaluates nothing itself
    data["resources"] = {"nodes": [{"gpus": 2}], "trainer": {"gpus": [0, 1]},
                         "rollout": [{"gpus": [1]}], "torchrun_port": free_ports(1)[0]}
    launcher = Launcher(RunConfig.model_validate(data), show_trainer_output=False)
    try:
        launcher.start()
        code = launcher.wait(timeout_s=300)
        audit = snapshot(launcher.cfg)["audit"]
    finally:
        launcher.shutdown()
    return launcher.cfg, code, audit


def test_the_trainer_runs_as_two_torchrun_ranks_to_the_end(finished_run):
    cfg, code, _ = finished_run
    assert code == 0
    rows = [r for r in read_metrics(f"{cfg.run_dir}/metrics.jsonl") if "train/loss" in r]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    log = (cfg.run_path / "logs" / "trainer.log").read_text()
    assert "rank 1 stopped with rank 0" in log, log[-3000:]


def test_the_books_balance(finished_run):
    _, _, audit = finished_run
    assert audit.balanced, audit.render()
    assert audit.counts["trainer_finished"] == STEPS * 2  # groups_per_batch 2
