"""The trainer's loop records throughput (samples/s, tokens/s) and staleness every step, redraws
reward.png and throughput.png, and its /metrics shows the newest figures and its totals."""

import threading

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from relay_svc.version_store import VersionStore
from relayrl.config import RunConfig
from relayrl.contracts import control
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.messages import Batch, Group, Sample, encode_batch
from relayrl.contracts.streams import FIELD
from relayrl.runtime.exporter import MetricsEndpoint
from relayrl.runtime.metrics import read_metrics
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from relayrl_torch.models.loading import load_model
from tests.conftest import free_ports
from trainer_svc import checkpoint
from trainer_svc.loop import Trainer
from trainer_svc.publisher import AsyncPublisher
from trainer_svc.server import trainer_metrics_of

STEPS, GROUP, RESPONSE = 3, 2, 3


def in_process_trainer(tmp_path, model_path, run_id: str, groups_per_batch: int,
                       trainer: dict, eval_every: int, plane=None
                       ) -> tuple[Trainer, EmbeddedRedis]:
    """A trainer on embedded Redis publishing into `plane`, by default an in-process
    version store."""
    server = EmbeddedRedis(tmp_path)
    cfg = RunConfig.model_validate({
        "run_id": run_id, "run_dir": str(tmp_path / "run"), "redis": {"url": server.url},
        "task": {"digits": 1, "eval_size": 4},
        "rollout": {"max_new_tokens": RESPONSE},
        "buffer": {"group_size": GROUP, "groups_per_batch": groups_per_batch},
        "trainer": {"progress": False, "checkpoint": {"every": 100}, **trainer},
        "eval": {"every": eval_every},
    })
    torch.manual_seed(0)
    return Trainer(cfg.trainer_part(), load_model(model_path), connect(server.url),
                   AsyncPublisher(plane or VersionStore(8))), server


def add_batch(t: Trainer, name: str, prompt_ids: list[int], version: int = 0) -> None:
    """One batch of GROUP-sample groups sampled by `version`, rewards 0..GROUP-1."""
    groups = [Group(pid, [
        Sample(prompt_id=pid, lease_id=f"L{pid}", worker_id="w",
               prompt_tokens=t.lm.encode_prompt(f"{pid % 10}+1="),
               response_tokens=[5 + k] * (RESPONSE - 1) + [t.lm.eos_id],
               logprobs=[-1.0] * RESPONSE, versions=[version] * RESPONSE, reward=float(k))
        for k in range(GROUP)]) for pid in prompt_ids]
    t.r.xadd(RunKeys(t.cfg.run_id).batches, {FIELD: encode_batch(Batch(name, groups))})


@pytest.fixture
def trainer(tmp_path, tiny_lm):
    t, server = in_process_trainer(
        tmp_path, tiny_lm.path, "tmetrics", 2,
        {"max_steps": STEPS, "max_staleness": 100, "plot_every": 1, "engine_check_seqs": 0},
        eval_every=2)
    for step in range(STEPS):
        add_batch(t, f"b{step}", [10 * step, 10 * step + 1])
    yield t
    t.publisher.close()
    server.shutdown()


def test_the_loop_records_throughput_and_exports_it(trainer):
    trainer.run(threading.Event())
    rows = [r for r in read_metrics(trainer.metrics.path) if r["step"] > 0]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert r["train/tokens"] == 2 * GROUP * RESPONSE
        assert r["staleness/lag_mean"] == r["step"] - 1  # every token is version 0
    assert rows[-1]["throughput/samples_per_s"] > 0 and rows[-1]["throughput/tokens_per_s"] > 0
    assert all(r["throughput/trainer_tokens_per_s"] > 0 for r in rows)
    assert rows[-1]["throughput/generated_tokens_per_s"] == 0  # no worker counted any
    for png in ("reward.png", "throughput.png"):
        assert (trainer.run_dir / png).stat().st_size > 10_000

    (port,) = free_ports(1)
    endpoint = MetricsEndpoint("trainer", "127.0.0.1", port, trainer_metrics_of(trainer),
                               lambda: True)
    endpoint.start()
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        endpoint.stop()
    got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
           if s.labels == {"service": "trainer"}}
    assert got["relayrl_train_step"] == STEPS and got["relayrl_train_finished"] == 1
    assert got["relayrl_train_samples_trained_total"] == STEPS * 2 * GROUP
    assert got["relayrl_weights_published_version"] == STEPS
    assert got["relayrl_weights_versions_published_total"] == STEPS
    assert got["relayrl_train_reward_mean"] == pytest.approx(rows[-1]["train/reward_mean"])
    assert got["relayrl_throughput_tokens_per_second"] == pytest.approx(
        rows[-1]["throughput/tokens_per_s"])
    assert got["relayrl_staleness_lag_max"] == STEPS - 1
    assert 0 <= got["relayrl_eval_accuracy_sampled"] <= 1  # kept from the step-2 eval
    per_set = {s.labels["set"]: s.value for f in text_string_to_metric_families(text)
               for s in f.samples if s.name == "relayrl_eval_set_pass_at_1"}
    assert per_set == {"heldout": pytest.approx(rows[-1]["eval/heldout/pass@1"])}
    assert got["relayrl_time_step_seconds"] > 0


def test_throughput_agrees_with_samples_trained_over_wall_time(trainer):
    trainer.run(threading.Event())
    rows = [r for r in read_metrics(trainer.metrics.path) if r["step"] > 0]
    trained = STEPS * 2 * GROUP
    last = rows[-1]
    assert last["throughput/run_samples_per_s"] == pytest.approx(
        trained / last["time/elapsed_s"], rel=1e-3)
    # the window (all of this short run) spans at least the steps' own time, and counts each
    # step's samples once
    assert last["throughput/samples_per_s"] <= trained / sum(r["time/step_s"] for r in rows)
    assert last["throughput/samples_per_s"] >= last["throughput/run_samples_per_s"]
    assert all(r["throughput/samples_per_s"] > 0 for r in rows)  # the first step's too


def test_the_starting_weights_are_not_evaluated_with_at_start_false(tmp_path, tiny_lm):
    t, server = in_process_trainer(
        tmp_path, tiny_lm.path, "noevalstart", 2,
        {"max_steps": 2, "max_staleness": 100, "engine_check_seqs": 0}, eval_every=2)
    t.cfg.eval.at_start = False
    try:
        for step in range(2):
            add_batch(t, f"b{step}", [10 * step, 10 * step + 1])
        t.run(threading.Event())
    finally:
        t.publisher.close()
        server.shutdown()
    rows = read_metrics(t.metrics.path)
    assert [r["step"] for r in rows] == [1, 2]
    assert "eval/accuracy_sampled" in rows[-1] and rows[-1]["time/eval_s"] > 0


def test_a_stop_during_an_evaluation_keeps_the_step_and_its_checkpoint(trainer):
    stop = threading.Event()
    evaluate = trainer.run_eval

    def signalled_during_eval(on_update=None, stop_event=None):
        if trainer.step == 2:  # a signal arrives while step 2's weights are evaluated
            stop.set()
        return evaluate(on_update, stop_event)

    trainer.run_eval = signalled_during_eval
    trainer.run(stop)
    rows = read_metrics(trainer.metrics.path)
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 2 written, without its eval
    assert "eval/accuracy_sampled" in rows[0] and "eval/accuracy_sampled" not in rows[-1]
    assert trainer.step == 2 and not trainer.finished
    assert checkpoint.latest(trainer.ckpt_dir).name == "step_00000002"


def test_live_settings_are_the_loop_s_own_and_leave_the_config_as_written(tmp_path, tiny_lm):
    """An operator's staleness bound and temperature change what the next step drops and how
    it rescores, and its record says so; the run's config keeps the values it was given."""
    t, server = in_process_trainer(
        tmp_path, tiny_lm.path, "live", 1,
        {"max_steps": 2, "max_staleness": 100, "engine_check_seqs": 0}, eval_every=0)
    try:
        add_batch(t, "b0", [0])
        add_batch(t, "b1", [1], version=0)  # one version behind at step 2
        control.write_settings(t.r, t.keys, control.LiveSettings(max_staleness=0,
                                                                 temperature=0.5))
        t.run(threading.Event())
    finally:
        t.publisher.close()
        server.shutdown()
    rows = [r for r in read_metrics(t.metrics.path) if r["step"] > 0]
    assert [(r["control/max_staleness"], r["control/temperature"]) for r in rows] == [
        (0, 0.5), (0, 0.5)]
    assert rows[1]["train/groups_dropped_stale"] == 1  # dropped by the live bound of 0
    assert t.objective.temperature == 0.5
    assert (t.cfg.trainer.max_staleness, t.cfg.live.temperature) == (100, 1.0)
