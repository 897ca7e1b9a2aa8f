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
         "relay_svc": "RelayRun", "eval_svc": "EvalRun"}
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
    assert (part.trainer.lora, part.trainer.max_steps, part.trainer.torch_threads) == (
        CFG.trainer.lora, 9, 3)
    assert part.torch_threads == 2
    assert part.weight_plane == part.pull_plane == CFG.rollout.weight_plane == "torch_dist"
    assert part.prompt_window() == CFG.prompt_window()
    assert part.generation == CFG.generation
    assert (part.generation.temperature, part.generation.max_new_tokens) == (0.7, 16)
    assert part.metric_sinks() == CFG.metric_sinks()
    assert part.sinks.tensorboard and part.sinks.wandb == CFG.trainer.wandb


def test_a_service_without_a_part_is_handed_the_whole_config():
    assert CFG.part("rollout_svc") is CFG


@pytest.mark.parametrize("service", sorted(PARTS))
def test_a_service_that_takes_its_part_names_no_run_config(service):
    for path in sorted((ROOT / service).rglob("*.py")):
        names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        names |= {a.asname or a.name for n in ast.walk(ast.parse(path.read_text()))
                  if isinstance(n, ast.ImportFrom) for a in n.names}
        assert "RunConfig" not in names, f"{path.relative_to(ROOT)} names RunConfig"
