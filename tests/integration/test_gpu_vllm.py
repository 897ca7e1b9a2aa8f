"""vLLM on CUDA, as RelayRL runs it: the engine starts under the model runner vLLM picks there
(V2 wherever Triton works) with RelayRL's greedy-temperature processor, beside a process
holding most of the GPU, and records the log-probabilities the trainer recomputes; versions
reach it through vLLM's weight-transfer engines from a relay in another process (CUDA IPC
on the relay's GPU, NCCL from another GPU); adapter versions through vLLM's LoRA support;
a sequence moves between two engines with its KV cache. Marked `gpu`: skipped, with the
reason, without CUDA or without vLLM's CUDA build."""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os

import pytest
import torch

from tests.conftest import free_ports

pytestmark = [
    pytest.mark.gpu, pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: "
                       "torch.cuda.is_available() is False on this machine"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="needs vLLM's CUDA build (the vllm extra)"),
]
HIDDEN, LAYERS, HEADS = 128, 2, 4
TOL = 2e-3  # float32 on both sides; CUDA kernels differ in summation order


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from relayrl.config import TinyModel
    from relayrl_tasks.tasks import AdditionTask
    from relayrl_torch.models.tiny import SPECIALS, build_model, build_tokenizer

    out = tmp_path_factory.mktemp("gpu_tiny")
    build_tokenizer(AdditionTask.alphabet, out)
    build_model(TinyModel(hidden_size=HIDDEN, num_layers=LAYERS, num_heads=HEADS),
                len(SPECIALS) + len(set(AdditionTask.alphabet)), out).save_pretrained(out)
    return out


def trainer_logprobs(model, prompt: list[int], tokens: list[int], temperature: float):
    ids = torch.tensor([prompt + tokens], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None])[:, 0].cpu()


def test_vllm_starts_on_cuda_beside_a_full_gpu_and_samples_at_the_spec_temperature(model_dir):
    from relayrl_torch.models.loading import load_model
    from rollout_svc.engines.api import SamplingSpec
    from rollout_svc.engines.vllm import VllmEngine

    free, total = torch.cuda.mem_get_info(0)
    hog = torch.empty(int(free - 6 * (1 << 30)), dtype=torch.uint8, device="cuda")  # a trainer
    engine = VllmEngine(model_dir, kv_cache_gib=1.0, max_model_len=256)
    try:
        assert engine.runner_v2, "vLLM chose its V1 runner: Triton does not work here"
        lm = load_model(model_dir)
        model = lm.model.cuda().eval()
        prompts = [lm.encode_prompt(p) for p in ("12+34=", "5+6=")]
        for spec in (SamplingSpec(max_new_tokens=4, greedy=True, temperature=0.7),
                     SamplingSpec(max_new_tokens=4, temperature=0.9, seed=1)):
            for prompt, out in zip(prompts, engine.generate(prompts, spec), strict=True):
                want = trainer_logprobs(model, prompt, out.tokens, spec.temperature)
                assert torch.allclose(torch.tensor(out.logprobs), want, atol=TOL), spec
    finally:
        engine.close()
        del hog


def serve_relay(planes: list[str], port: int, ready, stop) -> None:
    """A relay in a process of its own, on the GPU its CUDA_VISIBLE_DEVICES names (as the
    plan starts it)."""
    from relay_svc.planes import RelayPlanes
    from relay_svc.server import RelayServicer, add_relay_servicer
    from relay_svc.version_store import VersionStore
    from relayrl.runtime.grpc_util import make_server

    store = VersionStore(2, wait_timeout_s=30)
    planes_ = RelayPlanes(planes, "127.0.0.1", 60.0, device="cuda")
    server, _ = make_server(f"127.0.0.1:{port}", [(add_relay_servicer, RelayServicer(
        store, 1 << 20, planes_, 60))])
    server.start()
    ready.set()
    stop.wait()
    server.stop(0)
    planes_.shutdown()


@pytest.mark.parametrize("backend", ["ipc", "nccl"])
def test_versions_reach_vllm_through_its_weight_transfer_engines(model_dir, backend):
    if backend == "nccl" and torch.cuda.device_count() < 2:
        pytest.skip(f"NCCL needs the relay on another GPU; this machine has "
                    f"{torch.cuda.device_count()}")
    from relayrl_torch.models.loading import load_model
    from relayrl_torch.weights.client import RelayClient
    from relayrl_torch.weights.tied import tied_aliases, without
    from rollout_svc.engines.api import SamplingSpec
    from rollout_svc.engines.vllm import VllmEngine

    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    (port,) = free_ports(1)
    relay = ctx.Process(target=serve_relay, args=(["grpc", "vllm"], port, ready, stop))
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = "0" if backend == "ipc" else "1"  # what it inherits
    try:
        relay.start()
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
    engine = None
    try:
        assert ready.wait(120)
        lm = load_model(model_dir)
        torch.manual_seed(3)
        with torch.no_grad():
            for p in lm.model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        state = without({k: v.detach().clone() for k, v in lm.model.state_dict().items()},
                        tied_aliases(lm.model))
        address = f"127.0.0.1:{port}"
        RelayClient(address).publish(1, 1, state)
        engine = VllmEngine(model_dir, kv_cache_gib=0.5, max_model_len=256,
                            weight_transfer=backend)
        client = RelayClient(address, plane="vllm", timeout_s=60)
        engine.receive(client, client.manifest(1))
        assert engine.version == 1
        model = lm.model.cuda().eval()
        prompt = lm.encode_prompt("12+34=")
        spec = SamplingSpec(max_new_tokens=4, greedy=True, temperature=1.0)
        (out,) = engine.generate([prompt], spec)
        want = trainer_logprobs(model, prompt, out.tokens, 1.0)
        assert torch.allclose(torch.tensor(out.logprobs), want, atol=TOL)
    finally:
        if engine is not None:
            engine.close()
        stop.set()
        relay.join(30)
        if relay.is_alive():
            relay.kill()


def test_adapter_versions_are_served_by_vllms_lora_support_on_cuda(model_dir):
    from transformers import AutoModelForCausalLM

    from relayrl.config import LoraConfig
    from relayrl_torch.models.loading import load_model
    from relayrl_torch.models.lora import adapter_state, with_lora
    from rollout_svc.engines.api import SamplingSpec
    from rollout_svc.engines.vllm import VllmEngine

    lora = LoraConfig(rank=4, alpha=8, target_modules="all-linear")
    trained = with_lora(AutoModelForCausalLM.from_pretrained(model_dir), lora).cuda().eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.5)
    engine = VllmEngine(model_dir, kv_cache_gib=0.5, max_model_len=256, lora=lora)
    try:  # auto on a GPU: vLLM's LoRA layers
        assert engine.llm.llm_engine.vllm_config.lora_config is not None
        engine.load_weights({k: v.detach().cpu().clone() for k, v in
                             adapter_state(trained).items()}, 1)
        lm = load_model(model_dir)
        prompt = lm.encode_prompt("3+4=")
        (out,) = engine.generate([prompt], SamplingSpec(max_new_tokens=4, temperature=1.0))
        want = trainer_logprobs(trained, prompt, out.tokens, 1.0)
        assert torch.allclose(torch.tensor(out.logprobs), want, atol=TOL)
    finally:
        engine.close()


def test_a_sequence_moves_between_two_engines_with_its_kv_cache_on_cuda(tmp_path):
    """What tests/integration/test_vllm_kv_migration.py shows on the CPU, on the GPU: two
    engine processes on GPU 0, NIXL moving GPU blocks, under the base weights and under an
    adapter served by vLLM's LoRA support."""
    if importlib.util.find_spec("nixl_cu12") is None and importlib.util.find_spec("nixl") is None:
        pytest.skip("needs NIXL")
    from tests.integration import test_vllm_kv_migration as cpu

    cpu.test_a_moved_sequence_continues_from_the_pulled_blocks(tmp_path)
