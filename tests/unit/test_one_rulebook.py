"""One rulebook: the simulator's decisions, replayed through the services' own code, come out
the same. A traced simulation records every lease it granted or refused, every batch it
trained (which prompts it kept, which it dropped as stale) and every draining worker's
groups; the scheduler's LeasePolicy, the trainer's split_stale and the rollout's
restart_stale then decide the same events."""

import subprocess
import sys
from types import SimpleNamespace

import pytest

from relayrl.config import RunConfig
from relayrl.contracts.messages import Batch, Group, Sample
from relayrl.contracts.partial import PartialGroup, PartialSequence
from relayrl_sim import CostParams, LengthDist, SimConfig, Workload, heavy_tail
from relayrl_sim.streaming import Streaming
from rollout_svc.group_generator import GroupGenerator
from scheduler_svc.policy import LeasePolicy
from trainer_svc.batching import split_stale


def traced(max_staleness: int, repack: bool, tails: str = "drain") -> Streaming:
    workload = Workload(prompt=LengthDist("fixed", length=64),
                        response=heavy_tail(median=100, max_len=3000),
                        group_size=4, groups_per_worker=8)
    costs = CostParams(max_batch=32, train_fixed_s=0.1, weight_sync_s=0.2)
    sim = Streaming(SimConfig(workload=workload, costs=costs, steps=12, warmup=4,
                              max_staleness=max_staleness, tails=tails), 6, repack=repack)
    sim.trace = []
    sim.run()
    return sim


def group(prompt: int, version: int) -> Group:
    sample = Sample(prompt_id=prompt, lease_id="L", worker_id="w", prompt_tokens=[1],
                    response_tokens=[2, 3], logprobs=[-0.5, -0.5], versions=[version] * 2,
                    reward=0.0)
    return Group(prompt_id=prompt, samples=[sample])


CASES = [(s, repack) for s in (1, 2, 4) for repack in (False, True)]
TAILS = [(s, repack, tails) for s, repack in CASES for tails in ("drain", "preempt")]


@pytest.mark.parametrize("max_staleness, repack, tails", TAILS)
def test_the_trainer_keeps_what_the_simulator_trains(max_staleness, repack, tails):
    sim = traced(max_staleness, repack, tails)
    trains = [e for e in sim.trace if e[0] == "train"]
    assert len(trains) == sim.cfg.steps
    dropped = 0
    for _, version, versions, kept in trains:
        split = split_stale(Batch("b", [group(p, v) for p, v in versions]), version,
                            max_staleness)
        assert [g.prompt_id for g in split.kept] == kept
        dropped += len(split.stale)
    if max_staleness == 1:  # the heavy tail outlives a bound this tight
        assert dropped > 0


@pytest.mark.parametrize("max_staleness, repack", CASES)
def test_the_scheduler_grants_what_the_simulator_leased(max_staleness, repack):
    sim = traced(max_staleness, repack)
    policy = LeasePolicy(lease_ttl_s=1e12, max_attempts=1, max_inflight=sim.max_inflight)
    granted = refused = 0
    for event in sim.trace:
        if event[0] == "lease":
            _, wid, consumed, prompt = event
            policy.set_finished(consumed)
            assert [g.prompt_id for g in policy.acquire(f"w{wid}", 1, now=0.0)] == [prompt]
            granted += 1
        elif event[0] == "refused":
            _, wid, consumed = event
            policy.set_finished(consumed)
            assert policy.acquire(f"w{wid}", 1, now=0.0) == []
            refused += 1
    assert granted == sim.leased
    if max_staleness < 4:  # at 4 the workers' own staleness stops them before the cap does
        assert refused > 0


@pytest.mark.parametrize("max_staleness, repack", CASES)
def test_the_rollout_restarts_what_the_simulator_restarts(max_staleness, repack):
    """Nothing: an engine holds one version, so a draining worker's groups are as old as its
    weights, and restart_stale leaves a group alone while its engine is behind the floor
    (the simulator asserts this on every decision)."""
    sim = traced(max_staleness, repack)
    holds = [e for e in sim.trace if e[0] == "hold"]
    assert holds
    for _, _, engine_version, trainer_version in holds:
        gen = GroupGenerator(RunConfig().rollout_part(), SimpleNamespace(version=engine_version,
                                                          context_length=256),
                             lm=None, writer=None)
        gen.trainer_version, gen.max_staleness = trainer_version, max_staleness
        seq = PartialSequence(tokens=[7], logprobs=[-1.0], versions=[engine_version])
        gen.restart_stale([PartialGroup(3, [1, 2], [seq])])
        assert gen.groups_restarted_stale == 0


@pytest.mark.parametrize("max_staleness, repack", CASES)
def test_a_worker_reloads_under_no_group_the_rollout_would_restart(max_staleness, repack):
    """sim.tails preempt: a worker reloads under its running sequences only where the
    rollout, its engine on the new weights, would start none of their groups over. At
    bound 1 it reloads too: with two batches out, the second starts on the trainer's
    newest weights (relayrl.rules.staleness.oldest_startable), as the live lease asks."""
    sim = traced(max_staleness, repack, "preempt")
    swaps = [e for e in sim.trace if e[0] == "swap"]
    assert sim.swaps == len(swaps) > 0
    for _, _, old, new, prompt_versions in swaps:
        assert old < new
        gen = GroupGenerator(RunConfig().rollout_part(),
                             SimpleNamespace(version=new, context_length=256),
                             lm=None, writer=None)
        gen.trainer_version, gen.max_staleness = new, max_staleness
        groups = [PartialGroup(p, [1, 2], [PartialSequence(tokens=[7, 8], logprobs=[-1.0] * 2,
                                                           versions=[v, new])])
                  for p, v in enumerate(prompt_versions)]
        gen.restart_stale(groups)
        assert gen.groups_restarted_stale == 0


def test_the_simulator_takes_the_live_defaults():
    cfg, live = SimConfig(), RunConfig()
    assert cfg.max_staleness == live.trainer.max_staleness
    assert cfg.repack_below == live.scheduler.repack_below
    assert cfg.max_start_lag == live.scheduler.max_start_lag
    assert cfg.workload.group_size == live.buffer.group_size
    batch = live.buffer.groups_per_batch
    assert cfg.inflight_limit(batch) == live.inflight_limit


def test_the_simulator_imports_no_service():
    """Shared rules live in relayrl/; the simulator reaching into a service would fork them."""
    code = ("import sys, relayrl_sim.sweep, relayrl_sim.sensitivity; "
            "print(sorted(m for m in sys.modules if m.split('.')[0].endswith('_svc')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
