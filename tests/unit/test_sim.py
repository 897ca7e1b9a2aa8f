import dataclasses
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from relayrl_ops.cli import main
from relayrl_sim import (
    CostParams,
    LengthDist,
    SimConfig,
    Workload,
    config_from_mapping,
    fit_decode_cost,
    heavy_tail,
    load_costs,
    simulate,
)
from relayrl_sim.barrier import Fleet
from relayrl_sim.costs import costs_from_mapping
from relayrl_sim.streaming import ARRIVE, Streaming
from relayrl_sim.worker import Worker
from relayrl_sim.workload import Lengths, workload_from_mapping

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sim" / "heavy_tail.yaml"


def small(response: LengthDist | None = None, **sim) -> SimConfig:
    workload = Workload(prompt=LengthDist("fixed", length=64),
                        response=response or LengthDist("fixed", length=256),
                        group_size=4, groups_per_worker=8)
    costs = CostParams(max_batch=32, train_fixed_s=0.1, weight_sync_s=0.2)
    return SimConfig(workload=workload, costs=costs, **{"steps": 6, "warmup": 2, **sim})


def test_heavy_tail_p99_over_median_is_ten():
    draws = heavy_tail(median=1000, max_len=10**9).sample(np.random.default_rng(0), 400_000)
    ratio = np.percentile(draws, 99) / np.median(draws)
    assert ratio == pytest.approx(10, rel=0.03)


def test_lengths_depend_only_on_seed_and_id():
    wl = Workload(seed=3)
    a, b = Lengths(wl), Lengths(wl)
    a.ensure(3000)
    for n in (1, 1500, 3000):  # grown in other steps: same draws
        b.ensure(n)
    assert a.prompt[:3000] == b.prompt[:3000]
    assert a.response[:3000 * 8] == b.response[:3000 * 8]
    other = Lengths(dataclasses.replace(wl, seed=4))
    other.ensure(10)
    assert other.response[:80] != a.response[:80]


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="workload.response.kind"):
        Workload(response=LengthDist("pareto"))
    with pytest.raises(ValueError, match="workload.prompt.sigma"):
        Workload(prompt=LengthDist("lognormal", sigma=0))
    with pytest.raises(ValueError, match="workload.group_size"):
        workload_from_mapping({"group_size": 0})
    with pytest.raises(ValueError, match="workload.response.mean"):
        workload_from_mapping({"response": {"kind": "lognormal", "mean": 3}})
    with pytest.raises(ValueError, match="costs.decode_fixed_s"):
        CostParams(decode_fixed_s=-1.0)
    with pytest.raises(ValueError, match="costs.max_batch"):
        CostParams(max_batch=12.5)
    with pytest.raises(ValueError, match="costs.gpu_speed"):
        costs_from_mapping({"gpu_speed": 2})
    with pytest.raises(ValueError, match="sim.max_staleness"):
        SimConfig(max_staleness=-1)
    with pytest.raises(ValueError, match="sim.migration"):
        SimConfig(migration="rdma")
    with pytest.raises(ValueError, match="sim.tails"):
        SimConfig(tails="pause")
    with pytest.raises(ValueError, match="sim.warmup"):
        SimConfig(steps=4, warmup=4)
    with pytest.raises(ValueError, match="sim.repack"):
        config_from_mapping({"sim": {"repack": 0.5}})


def test_example_config_is_the_defaults():
    import yaml

    assert config_from_mapping(yaml.safe_load(EXAMPLE.read_text())) == SimConfig()


def test_costs_load_from_json_and_yaml(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"decode_fixed_s": 0.01, "max_batch": 64}))
    (tmp_path / "c.yaml").write_text("costs:\n  weight_sync_s: 5\n  train_per_token_s: 1e-4\n")
    assert load_costs(tmp_path / "c.json") == CostParams(decode_fixed_s=0.01, max_batch=64)
    assert load_costs(tmp_path / "c.yaml").weight_sync_s == 5
    assert load_costs(tmp_path / "c.yaml").train_per_token_s == 1e-4


def test_fit_decode_cost_recovers_synthetic_parameters():
    truth = CostParams(decode_fixed_s=8e-3, decode_per_seq_s=5e-5, decode_per_token_s=3e-8)
    rng = np.random.default_rng(0)
    rows = []
    for batch in (1, 8, 32, 64, 128, 256):
        for context in (1_000, 50_000, 200_000, 800_000):
            seconds = truth.decode_step_s(batch, context) * (1 + 0.01 * rng.standard_normal())
            rows.append((batch, context, seconds))
    fitted, rel_error = fit_decode_cost(rows)
    assert rel_error < 0.02
    for name in ("decode_fixed_s", "decode_per_seq_s", "decode_per_token_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.1)
    with pytest.raises(ValueError, match="measurements"):
        fit_decode_cost(rows[:2])


def test_worker_closed_form_matches_token_by_token():
    costs = CostParams()
    prompt, response = [100], [5, 9, 9, 30]
    w = Worker(0, costs, prompt, response, group_size=4)
    w.queue.extend((sid, 0) for sid in range(4))
    w.fill()
    start, finished = w.t, []
    while w.active:
        w.plan_next()
        finished += [(sid, w.t) for sid in w.advance(w.plan)]
    expected, t, ctx = [], start, 4 * 100
    for step in range(30):  # one decode step at a time
        live = [sid for sid in range(4) if response[sid] > step]
        t += costs.decode_step_s(len(live), ctx)
        ctx += len(live)
        for sid in live:
            if response[sid] == step + 1:
                expected.append((sid, t))
                ctx -= 100 + response[sid]
    assert [s for s, _ in finished] == [s for s, _ in expected]
    assert [t for _, t in finished] == pytest.approx([t for _, t in expected])
    assert start == pytest.approx(100 * costs.prefill_per_token_s)  # one prompt, shared


def test_kv_overflow_preempts_and_every_sequence_still_finishes():
    costs = CostParams(kv_budget_tokens=3000, max_batch=16)
    w = Worker(0, costs, [200] * 4, [900] * 16, group_size=4)
    w.queue.extend((sid, 0) for sid in range(16))
    done = []
    w.fill()
    while w.active:
        w.settle()
        w.plan_next()
        done += w.advance(w.plan)
        w.fill()
    assert sorted(done) == list(range(16))
    assert w.preemptions > 0


def test_sync_barrier_waits_for_one_long_sequence():
    cfg = small()
    short, long_ = Fleet(cfg, 2), Fleet(cfg, 2)
    for fleet in (short, long_):
        fleet.prompts(0)
    long_.lengths.response[3] = 5000  # worker 0's fourth sample
    assert short.generate(0, 0.0) < 256 * 0.02
    end = long_.generate(0, 0.0)
    assert end > 5000 * cfg.costs.decode_fixed_s
    assert long_.workers[1].t == pytest.approx(short.workers[1].t)  # the other worker idles


def test_closed_form_matches_event_loop():
    cfg = small(heavy_tail(median=200, max_len=4000))
    fast, slow = Fleet(cfg, 4), Fleet(cfg, 4)
    assert fast.generate(0, 1.0) == pytest.approx(slow.generate(0, 1.0, vectorized=False))
    assert [w.busy for w in fast.workers] == pytest.approx([w.busy for w in slow.workers])


def test_fixed_lengths_sync_and_async_agree():
    cheap = dict(train_fixed_s=1e-3, train_per_token_s=1e-9, weight_sync_s=1e-3, max_batch=32)
    cfg = dataclasses.replace(small(), costs=CostParams(**cheap))
    rates = {m: simulate(cfg, 4, m).trained_samples_per_s
             for m in ("sync", "async", "async_repack")}
    assert rates["async"] == pytest.approx(rates["sync"], rel=0.03)
    assert rates["async_repack"] == pytest.approx(rates["sync"], rel=0.03)


def test_staleness_per_mode():
    cfg = small(heavy_tail(median=100, max_len=2000))
    assert simulate(cfg, 4, "sync").staleness_max == 0
    one_off = simulate(cfg, 4, "one_step_off")
    assert one_off.staleness_seq["mean"] == one_off.staleness_max == 1
    assert simulate(cfg, 4, "async").staleness_max >= 1


def run_counting_every_sample(sim: Streaming) -> None:
    """Run `sim` and check every sample it leased either finished once or is still in flight
    once (running, queued or migrating): none lost, none duplicated."""
    finished: list[int] = []
    finish = sim.finish

    def record(samples):
        finished.extend(sid for _, sid in samples)
        finish(samples)

    sim.finish = record
    sim.run()
    in_flight = [sid for w in sim.workers for _, _, sid, _ in w.active]
    in_flight += [sid for w in sim.workers for sid, _ in w.queue]
    in_flight += [sid for w in sim.workers for _, sid in w.held]  # finished at a future event
    in_flight += [sid for _, _, kind, _, payload in sim.events if kind == ARRIVE
                  for sid, _ in payload[0]]
    counts = Counter(finished + in_flight)
    assert set(counts.values()) == {1}
    assert sorted(counts) == list(range(sim.leased * sim.group))


def test_repacking_moves_sequences_without_losing_or_duplicating_one():
    sim = Streaming(small(heavy_tail(median=100, max_len=3000), steps=10), 6, repack=True)
    run_counting_every_sample(sim)
    assert sim.migrations > 0


def test_heavy_tail_async_beats_sync_and_repacking_beats_async():
    cfg = small(heavy_tail(median=100, max_len=3000), steps=12, warmup=6)
    sync, plain, repack = (simulate(cfg, 16, m) for m in ("sync", "async", "async_repack"))
    assert plain.trained_samples_per_s > 3 * sync.trained_samples_per_s
    assert repack.trained_samples_per_s > 1.15 * plain.trained_samples_per_s
    assert sync.utilization < plain.utilization < repack.utilization <= 1
    assert repack.migrations > 0 and plain.migrations == 0


@pytest.mark.parametrize("mode", ["async", "async_repack"])
def test_starting_prompts_only_on_recent_weights_wastes_less(mode):
    """A prompt started k versions behind has max_staleness - k steps left before the
    trainer drops it: starting only on weights one version old (the default) drops less and
    trains more than starting on anything still trainable."""
    cfg = small(heavy_tail(median=100, max_len=3000), steps=12, warmup=6)
    early = simulate(cfg, 16, mode)
    late = simulate(dataclasses.replace(cfg, max_start_lag=cfg.max_staleness), 16, mode)
    assert cfg.max_start_lag == 1 < cfg.max_staleness
    assert early.dropped_share < late.dropped_share
    assert early.trained_samples_per_s > late.trained_samples_per_s
    assert early.staleness_max <= cfg.max_staleness


@pytest.mark.parametrize("repack", [False, True])
@pytest.mark.parametrize("tails", ["drain", "preempt"])
@pytest.mark.parametrize("bound", [3, 4])
def test_running_ahead_changes_nothing(repack, tails, bound):
    # at 3 (three batches out) a consumed batch lowers the start floor, so a draining worker
    # may take prompts again, and a step can begin the instant a run ahead ends
    cfg = small(heavy_tail(median=100, max_len=3000), steps=10, tails=tails, max_staleness=bound)
    runs = [Streaming(cfg, 6, repack, run_ahead=ahead).run() for ahead in (False, True)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("repack", [False, True])
def test_preempting_tails_loses_or_duplicates_no_sequence(repack):
    cfg = small(heavy_tail(median=100, max_len=3000), steps=10, tails="preempt")
    sim = Streaming(cfg, 6, repack=repack)
    run_counting_every_sample(sim)
    assert sim.swaps > 0 and sim.swap_tokens > 0


def test_a_preempted_sample_keeps_its_lag_and_its_later_tokens_are_fresher():
    """A sample's lag is its oldest token's; once preempted, the tokens after the reload
    carry the newer version, so they lag less; every trained token is counted once."""
    cfg = small(heavy_tail(median=100, max_len=3000), steps=12, warmup=6, tails="preempt")
    records = Streaming(cfg, 16, repack=False).run()
    split = 0
    for r in records[1:]:
        assert sum(n for _, n, _ in r.lags) == r.samples
        assert sum(t for _, _, t in r.lags) == r.tokens
        split += sum(t for _, n, t in r.lags if n == 0)
    assert split > 0
    drained = simulate(dataclasses.replace(cfg, tails="drain"), 16, "async")
    preempted = simulate(cfg, 16, "async")
    assert preempted.swaps > 0 and drained.swaps == 0
    assert preempted.wasted_tokens["swap"] > 0 and drained.wasted_tokens["swap"] == 0
    assert preempted.staleness_max <= cfg.max_staleness
    assert preempted.staleness_tok["mean"] < preempted.staleness_seq["mean"]


def test_simulation_is_deterministic_under_a_seed():
    cfg = small(heavy_tail(median=100, max_len=2000))

    def run(c):
        return {k: v for k, v in simulate(c, 5, "async_repack").as_dict().items()
                if k != "wall_seconds"}

    assert run(cfg) == run(cfg)
    reseeded = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, seed=1))
    assert run(reseeded) != run(cfg)


def test_cli_writes_table_json_and_plot(tmp_path, capsys):
    code = main(["simulate", "--workers", "2,4", "--steps", "3", "--warmup", "1",
                 "--dist", "lognormal", "--out", str(tmp_path), "--jobs", "1"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    summary = json.loads(out[-1])
    assert summary["workers"] == 4 and set(summary["speedup_vs_sync"]) == {
        "sync", "one_step_off", "async", "async_repack"}
    assert len(json.loads((tmp_path / "sim.json").read_text())["results"]) == 8
    assert set(summary["trained_samples_per_s"]) == {"2", "4"}
    assert all(v > 0 for v in summary["trained_samples_per_s"]["4"].values())
    assert max(summary["staleness_max"].values()) <= SimConfig().max_staleness
    assert (tmp_path / "sim.png").stat().st_size > 0
    assert math.isclose(summary["speedup_vs_sync"]["sync"], 1.0)


def test_cli_refuses_bad_flags(tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["simulate", "--modes", "sync,turbo", "--workers", "2", "--out", out]) == 2
    assert "--modes" in capsys.readouterr().err
    assert main(["simulate", "--dist", "zipf", "--out", out]) == 2
    assert "--dist" in capsys.readouterr().err
    assert main(["simulate", "--workers", "8,x", "--out", out]) == 2
    assert "--workers" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_distribution_weights_values_by_their_counts():
    from relayrl_sim.accounting import distribution

    assert distribution({0: 50, 1: 49, 5: 1}) == {"mean": 0.54, "p50": 0, "p99": 1, "max": 5}
    assert distribution({}) == {"mean": 0.0, "p50": 0, "p99": 0, "max": 0}


@pytest.mark.parametrize("mode", ["async", "async_repack"])
def test_only_what_the_staleness_rule_keeps_counts(mode):
    tight = simulate(small(heavy_tail(median=100, max_len=3000), steps=12, warmup=6,
                           max_staleness=1), 16, mode)
    assert tight.dropped_share > 0 and tight.wasted_tokens["dropped"] > 0
    assert tight.generated_samples_per_s > tight.trained_samples_per_s
    assert tight.staleness_max <= 1 and tight.staleness_tok["max"] <= 1
    loose = simulate(small(heavy_tail(median=100, max_len=3000), steps=12, warmup=6,
                           max_staleness=50, max_inflight_prompts=4 * 16 * 8), 16, mode)
    assert loose.dropped_share == 0 and loose.wasted_tokens["dropped"] == 0
    assert loose.generated_samples_per_s == pytest.approx(loose.trained_samples_per_s)


def test_a_migration_re_prefills_unless_its_kv_cache_moves():
    base = small(heavy_tail(median=100, max_len=3000), steps=12, warmup=6)
    again = simulate(base, 16, "async_repack")
    moved = simulate(dataclasses.replace(base, migration="kv"), 16, "async_repack")
    assert again.migrations > 0 and moved.migrations > 0
    assert again.wasted_tokens["reprefill"] > 0 and moved.wasted_tokens["reprefill"] == 0
    assert again.migration_s > 0 and moved.migration_s > 0


def test_sensitivity_scales_one_cost_at_a_time_and_checks_each_conclusion():
    from relayrl_sim import sensitivity

    costs = CostParams()
    doubled = sensitivity.scaled(costs, sensitivity.COSTS["decode step"], 2.0)
    assert doubled.decode_fixed_s == 2 * costs.decode_fixed_s
    assert doubled.decode_per_token_s == 2 * costs.decode_per_token_s
    assert doubled.prefill_per_token_s == costs.prefill_per_token_s
    cfg = small(heavy_tail(median=100, max_len=3000), steps=8, warmup=4)
    rows = sensitivity.run(cfg, 8, ("sync", "async", "async_repack"))
    assert [(r["cost"], r["factor"]) for r in rows[:3]] == [
        ("default", 1.0), ("decode step", 0.5), ("decode step", 2.0)]
    assert len(rows) == 1 + 2 * len(sensitivity.COSTS)
    assert all(r["speedup_vs_sync"]["sync"] == 1.0 for r in rows)
    slower_sync = next(r for r in rows if r["cost"] == "weight sync" and r["factor"] == 2.0)
    assert slower_sync["speedup_vs_sync"]["async"] > rows[0]["speedup_vs_sync"]["async"]
    assert set(rows[0]["conclusions"]) == {
        "async > sync", "repack > async", "best async >= 2x sync",
        "best async >= 5.5x sync", "staleness within bound"}
    assert set(sensitivity.surviving(rows)) <= set(rows[0]["conclusions"])


def test_cli_prints_the_sensitivity_table(capsys):
    code = main(["simulate", "--sensitivity", "--workers", "2,4", "--steps", "3",
                 "--warmup", "1", "--modes", "sync,async", "--jobs", "1"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and "weight sync" in "\n".join(out)
    last = json.loads(out[-1])
    assert last["workers"] == 4 and len(last["rows"]) == 11
