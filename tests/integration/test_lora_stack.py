"""LoRA on the real stack: the trainer trains an adapter, the relay ships adapter-only
versions, the workers' torch engines apply each one to their base model, and the engine's
log-probabilities match the trainer's under the same version (so the worker holds exactly
the trainer's model); the checkpoint holds the adapter."""

import pytest

from relayrl.config import RunConfig
from relayrl.runtime.metrics import read_metrics
from tests.conftest import run_to_end, small_stack_config

STEPS = 6


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    data = small_stack_config(tmp_path_factory.mktemp("lora"), steps=STEPS)
    data["trainer"].update(lora={"rank": 4, "alpha": 8}, checkpoint={"every": 3},
                           loss={"name": "grpo", "kl_coef": 0.05})
    return run_to_end(RunConfig.model_validate(data))


def test_an_adapter_run_finishes_with_the_workers_on_the_trainers_model(lora_run):
    cfg, code, state = lora_run
    assert code == 0
    trained = [r for r in read_metrics(f"{cfg.run_dir}/metrics.jsonl") if "train/loss" in r]
    assert len(trained) == STEPS
    assert all(r["train/kl_ref"] >= 0 for r in trained)  # the base, the adapter off
    for r in trained:
        assert r["rollout/engine_tokens_frac"] > 0
        assert r["rollout/engine_logp_absdiff"] < 1e-4, r
    assert state["versions"][-1] == STEPS
    assert all(w.weight_swaps >= 1 for w in state["workers"])
    last = sorted((cfg.run_path / "checkpoints").glob("step_*"))[-1]
    assert (last / "adapter_model.safetensors").is_file()
