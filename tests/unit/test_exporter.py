"""The Prometheus export: legal names with base units, counters as _total, labelled figures,
a failing snapshot that costs only its own figures, Stats classes declaring each figure once,
and every service's snapshot giving exactly the figures its Stats classes declare."""

import threading
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from buffer_svc.assembler import GroupAssembler
from buffer_svc.server import BufferService
from buffer_svc.telemetry import buffer_metrics
from relay_svc.telemetry import relay_metrics
from relay_svc.version_store import VersionStore
from relayrl.config.rollout import AgentEpisodesConfig
from relayrl.plugins.envs.calls import EnvCalls
from relayrl.runtime.backpressure import PressureCounters
from relayrl.runtime.exporter import RunnerStats, SnapshotCollector
from relayrl.runtime.metrics import StepRecord
from relayrl.runtime.stats import MetricSpec, Stats, counter, gauge, prometheus_name
from rollout_svc.episode_generator import EpisodeGenerator
from rollout_svc.serving.agent_episodes import AgentEpisodes
from rollout_svc.telemetry import AgentEpisodeStats, EpisodeStats, rollout_metrics
from scheduler_svc.policy import LeasePolicy, WorkerState
from scheduler_svc.telemetry import scheduler_metrics
from tests.unit.exported import ALL_SPECS
from trainer_svc.books import Books
from trainer_svc.telemetry import STEP_KINDS, EvalSetStats, trainer_metrics

LEGAL = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"


@pytest.mark.parametrize("name,expected", [
    ("rollout/tokens_generated", "relayrl_rollout_tokens_generated"),
    ("weights/pull_s", "relayrl_weights_pull_seconds"),
    ("throughput/samples_per_s", "relayrl_throughput_samples_per_second"),
    ("time/step_s", "relayrl_time_step_seconds"),
    ("rollout/engine_logp-absdiff", "relayrl_rollout_engine_logp_absdiff"),
])
def test_hierarchical_names_become_prometheus_names(name, expected):
    assert prometheus_name(name) == expected


def scrape(specs, snapshot, labels=None) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(specs, snapshot, labels or {"service": "x"}))
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_counters_gauges_and_labelled_figures():
    specs = (MetricSpec("a/done", "counter", "Done."), MetricSpec("a/last_s", "gauge", "Last."),
             MetricSpec("a/per_worker", "gauge", "Per worker.", label="worker"),
             MetricSpec("a/absent", "gauge", "Not in the snapshot: not exported."))
    got = scrape(specs, lambda: {"a/done": 3, "a/last_s": 0.5,
                                 "a/per_worker": {"w1": 2, "w0": 1}},
                 {"service": "rollout", "worker_id": "rollout-0"})
    base = (("service", "rollout"), ("worker_id", "rollout-0"))
    assert got == {
        ("relayrl_a_done_total", base): 3.0,
        ("relayrl_a_last_seconds", base): 0.5,
        ("relayrl_a_per_worker", tuple(sorted((*base, ("worker", "w0"))))): 1.0,
        ("relayrl_a_per_worker", tuple(sorted((*base, ("worker", "w1"))))): 2.0,
    }


@dataclass
class Example(Stats, section="a"):
    done: int = counter("Done.")
    last_s: float | None = gauge("Last.", section="b")
    per_worker: dict[str, int] = gauge("Per worker.", label="worker")


def test_stats_fields_declare_name_kind_help_and_unit():
    assert Example.specs() == (MetricSpec("a/done", "counter", "Done."),
                               MetricSpec("b/last_s", "gauge", "Last."),
                               MetricSpec("a/per_worker", "gauge", "Per worker.", "worker"))
    assert [s.unit for s in Example.specs()] == ["", "seconds", ""]
    stats = Example(done=3, last_s=None, per_worker={"w0": 1})
    assert stats.figures() == {"a/done": 3, "a/per_worker": {"w0": 1}}  # None: not reported
    assert Example.from_figures({"b/last_s": 0.5, "other": 1}) == Example(None, 0.5, None)
    with pytest.raises(TypeError):  # a figure left unfilled is a mistake, not a zero
        Example(done=1, last_s=0.5)


def test_a_failing_snapshot_exports_nothing_and_does_not_raise():
    def broken():
        raise ConnectionError("redis went away")

    assert scrape((MetricSpec("a/b", "gauge", "B."),), broken) == {}


def test_every_exported_name_is_legal_unique_and_described():
    names = [s.sample_name for s in ALL_SPECS]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for spec in ALL_SPECS:
        assert spec.sample_name.startswith("relayrl_")
        assert spec.help.endswith(".") and len(spec.help) > 5, spec
        assert not spec.name.endswith("_total"), spec  # the exporter adds it to counters
        assert "/" in spec.name, spec
    assert {s.name for s in RunnerStats.specs()} <= {s.name for s in ALL_SPECS}


def declared(exported) -> set[str]:
    return {s.name for s in exported.specs}


def test_relay_snapshot_gives_what_it_declares():
    store = VersionStore(2)
    exported = relay_metrics(store)
    assert set(exported.snapshot()) == declared(exported)


def test_scheduler_snapshot_gives_what_it_declares():
    policy = LeasePolicy(lease_ttl_s=10, max_attempts=2, max_inflight=8)
    policy.workers["w0"] = WorkerState(last_seen=0.0, policy_version=3)
    core = SimpleNamespace(policy=policy, lock=threading.Lock(),
                           saved=SimpleNamespace(partials={}), redis_oom_refusals=0)
    exported = scheduler_metrics(core)
    snap = exported.snapshot()
    assert set(snap) == declared(exported)
    assert snap["scheduler/worker_policy_version"] == {"w0": 3}
    assert snap["scheduler/inflight_limit"] == 8


def test_buffer_snapshot_gives_what_it_declares():
    svc = SimpleNamespace(
        lock=threading.Lock(), samples_read=5, samples_rejected=0, batches_emitted=1,
        batches_held=0, pressure=PressureCounters(), unread_batches=lambda: 1,
        pending_samples=lambda: 4, asm=GroupAssembler(groups_per_batch=1),
        submissions=SimpleNamespace(accepted=0, refused=0, stale=0, repeated=0),
        keys=SimpleNamespace(trajectories="t", batches="b"),
        r=SimpleNamespace(xlen=lambda key: {"t": 4, "b": 1}[key]))
    exported = buffer_metrics(lambda: BufferService.stats_snapshot(svc))
    snap = exported.snapshot()
    assert set(snap) == declared(exported)
    assert (snap["buffer/trajectory_stream_len"], snap["buffer/batch_stream_len"]) == (4, 1)


def test_rollout_snapshot_gives_what_it_declares():
    engine = SimpleNamespace(version=2, stats=lambda: {"tokens_generated": 60, "busy_s": 2.0})
    # the counters a worker's generator keeps, GroupGenerator's and EpisodeGenerator's alike
    generated = dict(segments=3, sequences_decoded=20, mid_sequence_swaps=0, groups_resumed=0,
                     groups_restarted_stale=0, kv_imported=0, kv_refused=0)
    worker = SimpleNamespace(
        worker_id="rollout-1", engine=engine, seats=16, scheduler_call_failures=0,
        generator=SimpleNamespace(**generated),
        boundary=SimpleNamespace(samples_generated=8, leases_released=0, groups_moved_out=0),
        weights=SimpleNamespace(weight_swaps=2, pull_failures=0, signatures_refused=0,
                                bytes_pulled=1024, last_pull_s=0.01, deltas_applied=1,
                                deltas_refused=0),
        loop=SimpleNamespace(seconds={"generate": 2.5, "lease": 0.1}),
        writer=SimpleNamespace(waiting_for_room=False, counters=PressureCounters()))
    exported = rollout_metrics(worker, SimpleNamespace(requests=0, batches=0))
    episode_names = {s.name for s in EpisodeStats.specs()}
    agent_names = {s.name for s in AgentEpisodeStats.specs()}
    snap = exported.snapshot()
    # no environment, no env/...; no OpenAI-compatible server, no agents/...
    assert set(snap) == declared(exported) - episode_names - agent_names
    assert snap["rollout/tokens_per_s"] == 30.0
    assert exported.labels == {"service": "rollout", "worker_id": "rollout-1"}
    worker.generator = object.__new__(EpisodeGenerator)
    vars(worker.generator).update(generated)
    worker.generator.episodes, worker.generator.turns, worker.generator.env_errors = 6, 11, 1
    worker.generator.env_error_kinds = {"step_timeout_s": 1}
    worker.generator.tool_calls, worker.generator.tool_error_kinds = 9, {"unknown_tool": 2}
    worker.generator.calls = EnvCalls(4)
    snap = exported.snapshot()
    assert set(snap) == declared(exported) - agent_names
    assert (snap["env/episodes"], snap["env/turns"], snap["env/errors"]) == (6, 11, 1)
    assert snap["env/errors_by_kind"] == {"step_timeout_s": 1} and snap["env/stuck_calls"] == 0
    assert snap["env/tool_calls"] == 9 and snap["env/tool_errors"] == {"unknown_tool": 2}
    episodes = AgentEpisodes(4, AgentEpisodesConfig(), (0.0, 1.0), submit=lambda *_: None)
    snap = rollout_metrics(worker, SimpleNamespace(requests=0, batches=0),
                           episodes=episodes).snapshot()
    assert set(snap) == declared(exported)
    assert snap["agents/held"] == 0 and snap["agents/dropped"] == {}


def test_trainer_snapshot_gives_what_it_declares_once_every_figure_was_recorded():
    publisher = SimpleNamespace(published_version=1, versions_published=1, bytes_published=10,
                                failures=0)
    trainer = SimpleNamespace(latest=StepRecord(0))
    exported = trainer_metrics(Books(step=1), publisher, lambda: trainer.latest, lambda: False)
    step_specs = [s for kind in (*STEP_KINDS, EvalSetStats) for s in kind.specs()]
    step_names = {s.name for s in step_specs}
    assert set(exported.snapshot()) == declared(exported) - step_names
    evals = {"eval/heldout/pass@1": 0.25, "eval/heldout/pass@8": 0.5,
             "eval/heldout/accuracy_greedy": 0.3, "eval/heldout/reward_mean": 0.2,
             "eval/heldout/response_len_mean": 9.0, "eval/gsm/pass@1": 0.1,
             "eval/accuracy_sampled": 0.2}
    # a labelled figure is one key per label in metrics.jsonl: errors/reward_error_kinds/raised
    recorded = {f"{s.name}/raised" if s.label else s.name: 0.5 for s in step_specs}
    trainer.latest = StepRecord.from_json(recorded | evals | {"train/unexported": 1.0})
    snap = exported.snapshot()
    assert set(snap) == declared(exported)
    assert snap["errors/reward_error_kinds"] == {"raised": 0.5}
    # each set's figures under its name (eval_set/...{set="gsm"} on /metrics)
    assert snap["eval_set/pass_at_1"] == {"heldout": 0.25, "gsm": 0.1}
    assert snap["eval_set/pass_at_k"] == {"heldout": 0.5}
    assert snap["eval_set/response_len_mean"] == {"heldout": 9.0}
