"""The real stack: embedded Redis, a root relay with a child relay that the workers pull
from (relay.children), scheduler, buffer, trainer and two rollout workers, each its own
process, for a few steps; then the books must balance exactly."""

import os
import time

import pytest

from relayrl.config import RunConfig
from relayrl.runtime.metrics import read_metrics
from relayrl_ops.launcher import Launcher
from relayrl_testkit.ports import free_port_block
from tests.conftest import small_stack_config, snapshot

STEPS, GROUPS, GROUP_SIZE = 10, 2, 4


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stack")
    data = small_stack_config(tmp, steps=STEPS, groups_per_batch=GROUPS,
                              group_size=GROUP_SIZE)
    data["relay"].update(children=1, children_base_port=free_port_block(1))
    cfg = RunConfig.model_validate(data)
    launcher = Launcher(cfg, show_trainer_output=False)
    try:
        launcher.start()
        code = launcher.wait()
        state = snapshot(launcher.cfg)
        pids = [c.proc.pid for c in launcher.children]
    finally:
        launcher.shutdown()
    exit_codes = {c.name: c.proc.returncode for c in launcher.children}
    return launcher.cfg, code, state, pids, exit_codes


def test_trainer_reached_its_target(finished_run):
    cfg, code, state, _, _ = finished_run
    assert code == 0
    rows = read_metrics(f"{cfg.run_dir}/metrics.jsonl")
    assert max(r["step"] for r in rows) == STEPS
    assert any("eval/accuracy_sampled" in r for r in rows)
    trained = [r for r in rows if "train/loss" in r]
    # both rates every step: what the workers generated (their counts in Redis), and the
    # trainer's own speed; the generation rate covers at least what was trained
    assert all(r["throughput/trainer_tokens_per_s"] > 0 for r in trained)
    assert trained[-1]["throughput/generated_tokens_per_s"] >= \
        0.5 * trained[-1]["throughput/tokens_per_s"] > 0
    assert os.path.isfile(f"{cfg.run_dir}/reward.png")
    assert any(p.name.startswith("step_") for p in (cfg.run_path / "checkpoints").iterdir())


def test_engine_and_trainer_agree_on_every_step(finished_run):
    """The engine's recorded log-probabilities, re-scored by the trainer under the version
    that sampled them: the same torch kernels, so the gap is rounding only."""
    cfg, _, _, _, _ = finished_run
    trained = [r for r in read_metrics(f"{cfg.run_dir}/metrics.jsonl") if "train/loss" in r]
    assert trained
    for r in trained:
        seen = {k: v for k, v in r.items() if k.startswith(("rollout/", "staleness/"))}
        assert r["rollout/engine_tokens_frac"] > 0, (r["step"], seen)
        assert r["rollout/engine_logp_absdiff"] < 1e-4, (r["step"], seen)
        assert r["rollout/engine_kl"] < 1e-6, (r["step"], seen)
        assert r["rollout/offpolicy_kl"] >= 0


def test_versions_advanced_and_workers_moved_between_them(finished_run):
    _, _, state, _, _ = finished_run
    assert state["versions"][-1] == STEPS
    for w in state["workers"]:
        assert len(w.versions_used) > 1, f"{w.worker_id} ran only versions {w.versions_used}"
        assert w.weight_swaps >= 1


def test_workers_took_every_version_from_the_child_relay(finished_run):
    """The child followed the root, and the workers pulled from it, not from the root."""
    cfg, _, _, _, _ = finished_run
    child, root = cfg.child_relay_addresses[0], cfg.relay.endpoint.address
    followed = (cfg.run_path / "logs" / "relay-child-0.log").read_text()
    assert f"followed from {root}" in followed
    for i in range(cfg.rollout.num_workers):
        log = (cfg.run_path / "logs" / f"rollout-{i}.log").read_text()
        assert f"from {child}" in log and f"from {root}" not in log, f"rollout-{i}"


def test_buffer_drained(finished_run):
    _, _, state, _, _ = finished_run
    b = state["buffer"]
    assert b.trajectory_stream_len == 0 and b.batch_stream_len == 0
    assert b.partial_groups == 0 and b.ready_groups == 0
    assert b.batches_emitted == STEPS
    assert state["pending_batches"] == 0


def test_prompt_accounting_is_exact(finished_run):
    _, _, state, _, _ = finished_run
    led, sched = state["ledger"], state["scheduler"]
    handed_out = led["leased"]
    assert sched.handed_out == len(handed_out) == STEPS * GROUPS
    finished = [led["consumed"], led["dropped"], led["failed"]]
    for a in range(3):  # no prompt ends twice
        for b in range(a + 1, 3):
            assert not finished[a] & finished[b]
    assert set().union(*finished) <= handed_out, "something finished that was never handed out"
    in_flight = handed_out - set().union(*finished)
    assert len(handed_out) == sum(len(s) for s in finished) + len(in_flight)
    assert in_flight == set() and led["failed"] == set()  # the run drained completely
    assert led["consumed"] | led["dropped"] == handed_out == led["batched"]
    audit = state["audit"]  # relayrl audit's reconciliation agrees, counts included
    assert audit.balanced, audit.render()
    assert (audit.counts["in_flight"], audit.counts["awaiting_trainer"]) == (0, 0)
    assert audit.counts["trainer_finished"] == STEPS * GROUPS


def test_every_process_stopped_cleanly(finished_run):
    _, _, _, pids, exit_codes = finished_run
    assert all(code == 0 for code in exit_codes.values()), exit_codes
    time.sleep(0.2)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_relayrl_audit_reopens_the_stopped_run_and_balances(finished_run, capsys):
    import json

    from relayrl_ops.cli import main

    cfg, _, _, _, _ = finished_run
    assert main(["audit", cfg.run_dir]) == 0  # the run directory: its Redis file, reloaded
    out = capsys.readouterr().out
    assert "books balance" in out and "FAIL" not in out
    report = json.loads((cfg.run_path / "audit.json").read_text())
    assert report["balanced"] and report["counts"]["trained"] + report["counts"][
        "dropped"] == STEPS * GROUPS
