"""Every family users bring trains with default settings: tiny random Llama, Qwen2, Qwen3,
Mistral, Gemma 2 and 3, Phi-3, Qwen2-MoE, Qwen3-MoE and Mixtral models with SmolLM2's
tokenizer and chat template take a trainer step, ship the version, and each engine that
applies it samples with the trainer's very log-probabilities. Tied and untied output layers
(Gemma's is its embedding, with no lm_head of its own), sliding windows (the torch engine
turns its KV reuse off for them) and experts are among them. vLLM's CPU build cannot swap a
mixture of experts' weights, so it refuses those families by name and the torch engine
serves them."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from relay_svc.version_store import VersionStore
from relayrl.config import ConfigError, RunConfig
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.messages import Batch, Group, Sample, encode_batch
from relayrl.contracts.streams import FIELD
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from relayrl_testkit.families import EXPERT_FAMILIES, FAMILIES, build_family
from relayrl_torch.models.loading import load_model
from relayrl_torch.models.smollm2 import ensure_smollm2
from rollout_svc.engines.api import SamplingSpec
from rollout_svc.engines.torch import TorchEngine
from trainer_svc.loop import Trainer
from trainer_svc.publisher import AsyncPublisher

ROOT = Path(__file__).resolve().parents[2]
@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict[str, Path]:
    tokenizer = ensure_smollm2(ROOT / ".cache/relayrl/models")
    out = tmp_path_factory.mktemp("families")
    return {name: build_family(name, out / name, tokenizer) for name in FAMILIES}


def trained_version(tmp_path: Path, model_dir: Path) -> tuple[Trainer, dict, list[int]]:
    """One trainer step on two samples the engine drew, and the version it shipped."""
    server = EmbeddedRedis(tmp_path)
    cfg = RunConfig.model_validate({
        "run_id": "family", "run_dir": str(tmp_path / "run"), "redis": {"url": server.url},
        "model": {"kind": "hf", "path": str(model_dir)}, "task": {"source": "addition"},
        "rollout": {"max_new_tokens": 4},
        "buffer": {"group_size": 2, "groups_per_batch": 1},
        "trainer": {"max_staleness": 100, "progress": False, "engine_check_seqs": 0,
                    "optimizer": {"lr": 1e-2}}})
    store = VersionStore(4)
    t = Trainer(cfg.trainer_part(), load_model(model_dir), connect(server.url),
                AsyncPublisher(store))
    prompt = t.lm.encode_chat([{"role": "user", "content": "What is 2+3?"}])
    samples = [Sample(prompt_id=1, lease_id="L", worker_id="w", prompt_tokens=prompt,
                      response_tokens=[10 + k, 20 + k, t.lm.eos_id], logprobs=[-1.0] * 3,
                      versions=[0] * 3, reward=float(k)) for k in range(2)]
    t.r.xadd(RunKeys("family").batches, {FIELD: encode_batch(Batch("b", [Group(1, samples)]))})
    t.train_step(*t.next_batch(threading.Event()))
    t.publisher.wait()
    version = store.pull(1)
    t.publisher.close()
    server.shutdown()
    return t, version, prompt


def trainer_logprobs(t: Trainer, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(t.lm.model(ids).logits[0, :-1].float(), -1)
    return logp[len(prompt) - 1:].gather(-1, ids[0, len(prompt):, None]).squeeze(-1)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_trains_and_the_torch_engine_applies_its_versions(tmp_path, families,
                                                                   family):
    t, version, prompt = trained_version(tmp_path, families[family])
    engine = TorchEngine(load_model(families[family]), kv_cache_tokens=4096)
    engine.load_weights(version, 1)
    (out,) = engine.generate([prompt], SamplingSpec(max_new_tokens=4, temperature=1.0))
    assert torch.allclose(torch.tensor(out.logprobs), trainer_logprobs(t, prompt, out.tokens),
                          atol=1e-4)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in EXPERT_FAMILIES])
def test_vllm_applies_a_familys_versions(tmp_path, families, family):
    pytest.importorskip("vllm")
    from rollout_svc.engines.vllm import VllmEngine

    t, version, prompt = trained_version(tmp_path, families[family])
    engine = VllmEngine(families[family], eos_ids=t.lm.eos_ids, kv_cache_gib=0.25)
    engine.load_weights(version, 1)
    (out,) = engine.generate([prompt], SamplingSpec(max_new_tokens=4, temperature=1.0))
    assert torch.allclose(torch.tensor(out.logprobs), trainer_logprobs(t, prompt, out.tokens),
                          atol=1e-3)


@pytest.mark.parametrize("family", EXPERT_FAMILIES)
def test_vllm_on_cpu_refuses_a_mixture_of_experts_by_name(families, family):
    pytest.importorskip("vllm")
    from transformers import AutoConfig

    from rollout_svc.engines.vllm import VllmEngine

    model_type = AutoConfig.from_pretrained(families[family]).model_type
    with pytest.raises(ConfigError, match=rf"weights of {model_type} \(a mixture of experts, "
                                          r"4 experts\) on CPU.*rollout.engine.kind: torch"):
        VllmEngine(families[family], kv_cache_gib=0.25)
