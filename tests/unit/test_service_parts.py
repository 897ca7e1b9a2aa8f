"""Each service is handed its part of the run (relayrl.config.services): the run's own values,
its section and the values it shares with others, typed and frozen; the handed values are
the ones the whole config derives; and the services that take a part name no RunConfig."""

import ast
from pathlib import Path

import pytest
from pydantic import ValidationError

from relayrl.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]
PARTS = {"trainer_svc": "TrainerRun", "scheduler_svc": "SchedulerRun", "buffer_svc": "BufferRun",
         "relay_svc": "RelayRun", "eval_svc": "EvalRun", "rollout_svc": "RolloutRun"}
CFG = RunConfig.model_validate({
    "run_id": "parts", "buffer": {"group_size": 3, "groups_per_batch": 5},
    "trainer": {"max_staleness": 2, "max_steps": 9, "torch_threads": 3, "tensorboard": True,
                "lora": {"rank": 4}},
    "rollout": {"temperature": 0.7, "max_new_tokens": 16, "max_active_groups": 2,
                "segment_tokens": 4, "torch_threads": 2, "weight_plane": "torch_dist"},
    "relay": {"children": 2, "chunk_bytes": 65536, "timeout_s": 7.5},
    "eval": {"mode": "separate", "every": 3}, "scheduler": {"repack": True}})


@pytest.mark.parametrize("service", sorted(PARTS))
def test_a_part_holds_the_run_s_own_values_and_is_frozen(service):
    part = CFG.part(service)
    assert type(part).__name__ == PARTS[service]
    for name in ("run_id", "run_dir", "redis", "auth", "model", "task"):
        assert getattr(part, name) == getattr(CFG, name)
    with pytest.raises(ValidationError):
        part.run_id = "other"


def test_the_scheduler_is_handed_what_the_whole_config_derives():
    part = CFG.part("scheduler_svc")
    assert (part.groups.group_size, part.groups.groups_per_batch) == (3, 5)
    assert (part.live.max_staleness, part.live.temperature) == (2, 0.7)
    assert part.inflight_limit == CFG.inflight_limit
    assert part.repack_capacity == CFG.repack_capacity == 6
    assert part.prompt_window() == CFG.prompt_window()


def test_the_trainer_is_handed_what_the_whole_config_derives():
    part = CFG.part("trainer_svc")
    assert (part.generation.max_new_tokens, part.generation.temperature) == (16, 0.7)
    assert not part.generation.episodes
    assert part.publish.address == CFG.relay.endpoint.address
    assert part.publish.shm_dir is None  # published over gRPC
    assert part.prompt_window() == CFG.prompt_window()
    assert part.eval == CFG.eval and part.trainer == CFG.trainer


def test_the_evaluator_is_handed_what_the_whole_config_derives():
    part = CFG.part("eval_svc")
    assert part.eval == CFG.eval
    assert part.relays.addresses == CFG.relay_addresses and len(part.relays.addresses) == 2
    assert (part.relays.chunk_bytes, part.relays.timeout_s) == (65536, 7.5)
    assert (part.follows.lora, part.follows.max_steps, part.follows.torch_threads) == (
        CFG.trainer.lora, 9, 3)
    assert part.torch_threads == 2
    assert part.weight_plane == part.pull_plane == CFG.rollout.weight_plane == "torch_dist"
    assert part.prompt_window() == CFG.prompt_window()
    assert part.generation == CFG.generation
    assert (part.generation.temperature, part.generation.max_new_tokens) == (0.7, 16)
    assert part.metric_sinks() == CFG.metric_sinks()
    assert part.sinks.tensorboard and part.sinks.wandb == CFG.trainer.wandb


def test_a_rollout_worker_is_handed_what_the_whole_config_derives():
    part = CFG.part("rollout_svc")
    assert part.rollout == CFG.rollout and part.bench == CFG.bench
    assert (part.groups.group_size, part.groups.groups_per_batch) == (3, 5)
    assert part.live == CFG.live_defaults()
    assert part.submit.reward_range == CFG.buffer.reward_range
    assert part.submit.max_pending_samples == CFG.buffer.max_pending_samples
    s = CFG.scheduler
    assert (part.lease.address, part.lease.call_timeout_s, part.lease.heartbeat_interval_s,
            part.lease.lease_ttl_s, part.lease.max_start_lag, part.lease.repack_below) == (
        s.endpoint.address, s.call_timeout_s, s.heartbeat_interval_s, s.lease_ttl_s,
        s.max_start_lag, s.repack_below)
    assert part.lease.repack_capacity == CFG.repack_capacity == 6
    assert part.relays == CFG.relay_link() and len(part.relays.addresses) == 2
    assert part.lora == CFG.trainer.lora
    assert part.vllm_transfer is None  # pulled over torch_dist, not into vLLM
    assert part.prompt_window() == CFG.prompt_window()


def test_a_vllm_plane_worker_is_handed_its_own_transfer_engine():
    """Worker 0 shares its relay's GPU (ipc), worker 1 does not (nccl)."""
    def worker(index):
        return RunConfig.model_validate({
            "relay": {"data_planes": ["grpc", "vllm"]},
            "rollout": {"weight_plane": "vllm", "engine": {"kind": "vllm"}, "num_workers": 2,
                        "worker_index": index},
            "resources": {"nodes": [{"gpus": 2}], "relay": {"gpus": [0]},
                          "rollout": [{"gpus": [0, 1]}]}})
    assert [worker(i).part("rollout_svc").vllm_transfer for i in (0, 1)] == ["ipc", "nccl"]


def test_a_service_without_a_part_is_refused_by_name():
    with pytest.raises(ValueError, match="'tools_svc' has no part"):
        CFG.part("tools_svc")


@pytest.mark.parametrize("service", sorted(PARTS))
def test_a_service_that_takes_its_part_names_no_run_config(service):
    for path in sorted((ROOT / service).rglob("*.py")):
        names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        names |= {a.asname or a.name for n in ast.walk(ast.parse(path.read_text()))
                  if isinstance(n, ast.ImportFrom) for a in n.names}
        assert "RunConfig" not in names, f"{path.relative_to(ROOT)} names RunConfig"
