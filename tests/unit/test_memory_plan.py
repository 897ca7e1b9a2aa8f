"""The memory plan `relayrl check` prints names every copy of the weights each service
keeps, and follows the settings that keep them: the dtype versions ship in, a LoRA adapter,
the KL reference, the engine check's past versions, the relay's kept versions."""

from relayrl.config import RunConfig
from relayrl_ops.check import memory_plan

P = 1_000_000


def plan(data: dict, adapter: int = 0) -> dict[str, dict[str, float]]:
    cfg = RunConfig.model_validate(data)
    return {service: dict(parts) for service, _, parts in memory_plan(cfg, P, adapter)}


def test_full_fine_tuning_in_float32():
    got = plan({"trainer": {"engine_check_versions": 2}, "relay": {"keep_versions": 3}})
    trainer = got["trainer"]
    assert trainer["float32 weights"] == 4 * P
    assert trainer["gradients and Adam moments"] == 12 * P
    assert trainer["past versions for the engine check (trainer.engine_check_versions)"] \
        == 2 * 4 * P
    assert trainer["two publish snapshots"] == 2 * 4 * P
    assert got["relay"]["3 versions (relay.keep_versions)"] == 3 * 4 * P
    assert got["rollout worker"]["float32 weights"] == 4 * P


def test_bfloat16_halves_what_is_shipped_and_held_by_the_engines():
    got = plan({"model": {"dtype": "bfloat16"}, "relay": {"keep_versions": 2}})
    assert got["trainer"]["float32 weights"] == 4 * P  # the master stays float32
    assert got["relay"]["2 versions (relay.keep_versions)"] == 2 * 2 * P
    assert got["rollout worker"]["bfloat16 weights"] == 2 * P


def test_an_adapter_run_trains_and_ships_the_adapter_and_keeps_no_reference_copy():
    got = plan({"trainer": {"lora": {"rank": 4}, "loss": {"name": "grpo", "kl_coef": 0.1}}},
               adapter=P // 100)
    trainer = got["trainer"]
    assert trainer["gradients and Adam moments"] == 12 * P // 100
    assert trainer["KL reference (trainer.loss.kl_coef)"] == 0
    full = plan({"trainer": {"loss": {"name": "grpo", "kl_coef": 0.1}}})
    assert full["trainer"]["KL reference (trainer.loss.kl_coef)"] == 4 * P
