"""The memory plan `relayrl check` prints names every copy of the weights each service
keeps, and follows the settings that keep them: the dtype versions ship in, a LoRA adapter,
the KL reference, the engine check's past versions, the relay's kept versions, AdamW's
moments (none under Adafactor). The trainer's activations, counted on the meta device, are
what a real pass keeps for its backward."""

import pytest
import torch
from torch.autograd.graph import saved_tensors_hooks

from relayrl.config import RunConfig, TinyModel
from relayrl_ops.memory_plan import (
    memory_plan,
    pass_activations,
    pass_shape,
    prompt_tokens,
    row_tokens,
)
from relayrl_torch.models.tiny import build_model

P = 1_000_000


def plan(data: dict, adapter: int = 0, activations: tuple[int, int] | None = None,
         kv_per_token: int = 0) -> dict[str, dict[str, float]]:
    cfg = RunConfig.model_validate(data)
    return {service: dict(parts)
            for service, _, parts in memory_plan(cfg, P, adapter, activations, kv_per_token)}


def test_full_fine_tuning_in_float32():
    got = plan({"trainer": {"engine_check_versions": 2}, "relay": {"keep_versions": 3}})
    trainer = got["trainer"]
    assert trainer["float32 weights"] == 4 * P
    assert trainer["gradients"] == 4 * P
    assert trainer["AdamW moments (trainer.optimizer)"] == 8 * P
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
    assert trainer["gradients"] + trainer["AdamW moments (trainer.optimizer)"] \
        == 12 * P // 100
    assert trainer["KL reference (trainer.loss.kl_coef)"] == 0
    full = plan({"trainer": {"loss": {"name": "grpo", "kl_coef": 0.1}}})
    assert full["trainer"]["KL reference (trainer.loss.kl_coef)"] == 4 * P


def test_adafactor_keeps_no_moment_per_parameter():
    trainer = plan({"trainer": {"optimizer": "adafactor"}})["trainer"]
    assert trainer["gradients"] == 4 * P
    assert trainer["AdamW moments (trainer.optimizer)"] == 0


def tiny(layers: int = 2):
    return build_model(TinyModel(hidden_size=64, num_layers=layers, num_heads=4), 300, None)


def meta_tiny(layers: int = 2):
    with torch.device("meta"):
        return tiny(layers)


def kept_by_a_real_pass(model, rows: int, length: int) -> int:
    """Bytes a real CPU training pass keeps for its backward (each storage once, the weights
    left out), plus the
    two [tokens, vocabulary] float32 gradients the plan adds for the backward."""
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (rows, length))
    kept: dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        logits = model(input_ids=ids).logits[:, :-1]
        torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None])
    return sum(kept.values()) + 2 * rows * (length - 1) * model.config.vocab_size * 4


def test_the_activation_count_matches_what_a_real_pass_keeps():
    predicted = pass_activations(meta_tiny(), 4 * 60, 4, checkpointing=False)
    assert predicted == pytest.approx(kept_by_a_real_pass(tiny(), 4, 60), rel=0.02)


def test_activations_grow_with_the_rows_and_shrink_with_checkpointing():
    one = pass_activations(meta_tiny(), 60, 1, checkpointing=False)
    # all but the positions' rotary tables, which every row shares
    assert pass_activations(meta_tiny(), 4 * 60, 4, checkpointing=False) == pytest.approx(
        4 * one, rel=0.02)
    deep = pass_activations(meta_tiny(layers=8), 60, 1, checkpointing=False)
    # a layer keeps its input; one layer's activations are recomputed at a time
    assert pass_activations(meta_tiny(layers=8), 60, 1, checkpointing=True) < deep / 3


def test_the_largest_pass_follows_micro_batch_tokens():
    def config(trainer: dict) -> RunConfig:
        return RunConfig.model_validate({"trainer": trainer,
                                         "rollout": {},
                                         "buffer": {"groups_per_batch": 2, "group_size": 4}})

    plain = {"shared_prefix": False}
    row = row_tokens(config(plain))
    assert pass_shape(config({**plain, "micro_batch_tokens": 0})) == (8 * row, 8)  # whole
    assert pass_shape(config({**plain, "micro_batch_tokens": 3 * row + 1})) == (3 * row, 3)
    assert pass_shape(config({**plain, "micro_batch_tokens": 1})) == (row, 1)  # one, alone
    # responses within the bound, and each group's prompt besides
    shared = config({"shared_prefix": True, "micro_batch_tokens": row})
    prompt = prompt_tokens(shared)
    tokens, _ = pass_shape(shared)
    assert tokens == min(8 * (row - prompt), row) + 2 * prompt
    got = plan({"trainer": {**plain, "micro_batch_tokens": 1}},
               activations=(row, 123))["trainer"]
    assert got[f"activations of a {row}-token pass (trainer.micro_batch_tokens)"] == 123


def test_a_measured_prompt_sizes_the_rows_unless_an_environment_plays_them():
    cfg = RunConfig.model_validate({"rollout": {"max_new_tokens": 20}})
    assert row_tokens(cfg, longest_prompt=30) == 50
    assert row_tokens(cfg) == min(cfg.prompt_window().engine,
                                  cfg.prompt_window().longest + 20)
    env = RunConfig.model_validate({"rollout": {
        "max_new_tokens": 20,
        "environment": {"cls": "relayrl_tasks.envs.calculator:Calculator"}}})
    assert row_tokens(env, longest_prompt=30) == env.prompt_window().engine


def test_evaluation_plans_its_kv_cache_where_it_runs():
    per_token = 1000
    separate = plan({"eval": {"mode": "separate", "batch_size": 8}}, kv_per_token=per_token)
    row = row_tokens(RunConfig.model_validate({}))
    kv = f"KV cache of 8 sequences of {row} tokens (eval.batch_size)"
    assert separate["evaluator"] == {"float32 weights": 4 * P, kv: 8 * row * per_token * 4}
    inline = plan({"eval": {"batch_size": 8}}, kv_per_token=per_token)
    assert "evaluator" not in inline
    assert inline["trainer"][f"{kv}, between steps"] == 8 * row * per_token * 4
    assert "evaluator" not in plan({"eval": {"mode": "separate", "every": 0}},
                                   kv_per_token=per_token)


def test_a_cpu_trainer_publishing_through_shared_memory_keeps_no_copies_of_its_own():
    """Versions are written straight into their files, and the engine check's float32
    versions are read from those the relay still keeps."""
    shm = {"relay": {"data_planes": ["grpc", "shm"], "shm_dir": "/dev/shm", "keep_versions": 2},
           "trainer": {"publish_plane": "shm", "device": "cpu", "engine_check_versions": 2}}
    trainer = plan(shm)["trainer"]
    assert trainer["two publish snapshots"] == 0
    past = "past versions for the engine check (trainer.engine_check_versions)"
    assert trainer[past] == 4 * P  # one of the two the relay has let go
    assert plan({**shm, "model": {"dtype": "bfloat16"}})["trainer"][past] == 2 * 4 * P
