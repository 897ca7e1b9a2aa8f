"""A run through `relayrl up` trains a tiny mixture of experts with routing replay on: every
batch the trainer takes carries the engine's routes for all its policy tokens, and the
trainer's log-probabilities of same-version tokens match the engine's. A dense model's run
replays nothing and trains as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay_svc.version_store import VersionStore
from relayrl.config import ConfigError, RunConfig
from relayrl.runtime.metrics import read_records
from relayrl_testkit.families import build_family
from relayrl_torch.models.loading import load_model
from relayrl_torch.models.smollm2 import ensure_smollm2
from tests.conftest import free_ports, run_to_end
from trainer_svc.loop import Trainer
from trainer_svc.publisher import AsyncPublisher

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer() -> Path:
    return ensure_smollm2(ROOT / ".cache/relayrl/models")


def config(tmp_path: Path, model: Path, **trainer) -> RunConfig:
    ports = free_ports(6)
    return RunConfig.model_validate({
        "run_id": "replay", "run_dir": str(tmp_path / "run"),
        "model": {"kind": "hf", "path": str(model)},
        "relay": {"endpoint": {"port": ports[0]}},
        "scheduler": {"endpoint": {"port": ports[1]}, "start_after_workers": 1,
                      "max_prompts": 4},
        "buffer": {"endpoint": {"port": ports[2]}, "group_size": 2, "groups_per_batch": 2},
        "trainer": {"endpoint": {"port": ports[3]}, "max_steps": 2, "progress": False,
                    "max_staleness": 0, **trainer},
        "eval": {"every": 0},
        "rollout": {"base_port": ports[4], "num_workers": 1, "max_new_tokens": 6}})


def test_a_mixture_of_experts_trains_with_routing_replay(tmp_path, tokenizer):
    model = build_family("qwen3_moe", tmp_path / "model", tokenizer)
    cfg, code, _ = run_to_end(config(tmp_path, model))
    assert code == 0
    figures = [r.figures for r in read_records(Path(cfg.run_dir) / "metrics.jsonl")
               if r.figures.samples]
    assert len(figures) == 2
    assert all(f.routes_replayed_frac == 1.0 for f in figures)
    # max_staleness 0: every token is the trainer's own version, scored with the engine's
    # experts (both float32 here: rounding alone)
    assert all(f.engine_logp_absdiff is not None and f.engine_logp_absdiff < 1e-4
               for f in figures)


def test_a_dense_model_replays_nothing(tmp_path, tokenizer):
    model = build_family("qwen3", tmp_path / "model", tokenizer)
    cfg, code, _ = run_to_end(config(tmp_path, model))
    assert code == 0
    figures = [r.figures for r in read_records(Path(cfg.run_dir) / "metrics.jsonl")
               if r.figures.samples]
    assert len(figures) == 2 and all(f.routes_replayed_frac is None for f in figures)


def test_routing_replay_with_activation_checkpointing_is_refused_by_name(tmp_path, tokenizer):
    model = build_family("mixtral", tmp_path / "model", tokenizer)
    cfg = config(tmp_path, model, activation_checkpointing=True)
    with pytest.raises(ConfigError, match=r"trainer.routing_replay with "
                                          r"trainer.activation_checkpointing.*mixtral"):
        Trainer(cfg.trainer_part(), load_model(model), None, AsyncPublisher(VersionStore(2)))
