"""The torch engine keeps, exports and imports sequences' KV states: a sequence continued from
a state, on the same engine or on another one, generates what it would have without moving."""

import pytest
import torch

from relayrl.config import TinyModel
from relayrl.contracts.codec import CodecError
from relayrl_torch.models.loading import load_model
from relayrl_torch.models.tiny import build_model
from relayrl_torch.sampling.kv_state import SequenceKV
from rollout_svc.engines.api import SamplingSpec
from rollout_svc.engines.torch import TorchEngine

PROMPT_LENGTHS = (5, 12, 3, 9)


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, 15, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def greedy(n: int) -> SamplingSpec:
    return SamplingSpec(max_new_tokens=n, greedy=True, ignore_eos=True, keep_state=True)


def extend(contexts, outs):
    return [c + o.tokens for c, o in zip(contexts, outs, strict=True)]


def assert_same_continuation(expected, *parts):
    for i, want in enumerate(expected):
        tokens = [t for p in parts for t in p[i].tokens]
        logprobs = [x for p in parts for x in p[i].logprobs]
        assert tokens == want.tokens, i
        assert logprobs == pytest.approx(want.logprobs, abs=1e-5), i


@pytest.fixture(scope="module")
def lm_path(tiny_lm, tmp_path_factory):
    """The tiny model with weights large enough that greedy decoding does not settle on one
    token, saved so each engine loads its own copy."""
    out = tmp_path_factory.mktemp("sharp_lm")
    model = build_model(TinyModel(hidden_size=32, num_layers=2, num_heads=2),
                        tiny_lm.model.config.vocab_size, out)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.normal_(0, 2.0 / p.shape[1] ** 0.5)
    model.save_pretrained(out)
    tiny_lm.tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def lm(lm_path):
    return load_model(lm_path)


@pytest.fixture(scope="module")
def other_shape_lm(tiny_lm, tmp_path_factory):
    out = tmp_path_factory.mktemp("three_layers")
    tiny_lm.tokenizer.save_pretrained(out)
    cfg = TinyModel(hidden_size=32, num_layers=3, num_heads=2)
    build_model(cfg, tiny_lm.model.config.vocab_size, out).save_pretrained(out)
    return load_model(out)


def test_a_migrated_sequence_continues_as_its_source_would_have(lm, lm_path):
    ps, n, k = prompts(), 12, 5
    one_shot = TorchEngine(lm).generate(ps, greedy(n))
    assert all(len(set(o.tokens)) > 2 for o in one_shot)  # one repeated token would prove little

    source = TorchEngine(lm, kv_cache_tokens=1000)
    head = source.generate(ps, greedy(k))
    contexts = extend(ps, head)
    dest = TorchEngine(load_model(lm_path), kv_cache_tokens=1000)
    migrated = [0, 1, 3]  # sequence 2 moves by its tokens alone and is re-prefilled
    for i in migrated:
        dest.import_state(SequenceKV.decode(source.export_state(contexts[i]).encode()))
    assert dest.export_state(contexts[2]) is None
    tail = dest.generate(contexts, greedy(n - k))

    assert_same_continuation(one_shot, head, tail)
    assert dest.stats()["tokens_resumed"] == sum(len(contexts[i]) - 1 for i in migrated)


def test_resuming_from_kept_states_equals_re_prefilling(lm):
    kept, plain = TorchEngine(lm, kv_cache_tokens=1000), TorchEngine(lm)
    results = {}
    for name, engine in (("kept", kept), ("plain", plain)):
        contexts, segments = prompts(), []
        for _ in range(3):
            segments.append(engine.generate(contexts, greedy(4)))
            contexts = extend(contexts, segments[-1])
        results[name] = segments
    whole = [type(o)(tokens=[t for s in results["plain"] for t in s[i].tokens],
                     logprobs=[x for s in results["plain"] for x in s[i].logprobs],
                     finish_reason="length") for i, o in enumerate(results["plain"][0])]
    assert_same_continuation(whole, *results["kept"])
    # Segments 2 and 3 resumed every sequence; each sequence holds one state, the latest.
    assert kept.stats()["tokens_resumed"] > 0 and plain.stats()["tokens_resumed"] == 0
    assert len(kept.states) == len(PROMPT_LENGTHS)
    assert kept.states.tokens_held == sum(len(c) - 1 for c in contexts)


def test_refused_imports_leave_the_engine_as_it_was(lm, lm_path, other_shape_lm):
    source = TorchEngine(lm, kv_cache_tokens=1000)
    contexts = extend(prompts(), source.generate(prompts(), greedy(3)))
    state = source.export_state(contexts[1])
    foreign_source = TorchEngine(other_shape_lm, kv_cache_tokens=1000)
    foreign = foreign_source.export_state(
        extend(contexts[:1], foreign_source.generate(contexts[:1], greedy(2)))[0])

    dest = TorchEngine(load_model(lm_path), version=0, kv_cache_tokens=1000)
    dest.import_state(source.export_state(contexts[0]))
    before = (len(dest.states), dest.states.tokens_held)
    with pytest.raises(ValueError, match="another model.*num_layers 3 != 2"):
        dest.import_state(foreign)
    payload = state.encode()
    with pytest.raises(CodecError):
        SequenceKV.decode(payload[:-100])
    at = payload.index(state.keys.numpy().tobytes()) + 100
    flipped = payload[:at] + bytes([payload[at] ^ 1]) + payload[at + 1:]
    with pytest.raises(CodecError, match="sequence_kv.checksum"):
        SequenceKV.decode(flipped)
    assert (len(dest.states), dest.states.tokens_held) == before

    newer = TorchEngine(load_model(lm_path), version=1, kv_cache_tokens=1000)
    with pytest.raises(ValueError, match="version 0, the model holds 1"):
        newer.import_state(state)
    with pytest.raises(ValueError, match="kv_cache_tokens=0"):
        TorchEngine(lm).import_state(state)
    with pytest.raises(ValueError, match="exceed kv_cache_tokens=4"):
        TorchEngine(lm, kv_cache_tokens=4).import_state(state)
    assert len(newer.states) == 0


def test_loading_weights_drops_every_kept_state(lm_path):
    engine = TorchEngine(load_model(lm_path), kv_cache_tokens=1000)
    contexts = extend(prompts(), engine.generate(prompts(), greedy(3)))
    state = engine.export_state(contexts[0])
    assert state is not None and len(engine.states) == len(contexts)
    weights = {k: v.clone() for k, v in engine.lm.model.state_dict().items()}
    engine.load_weights(weights, version=1)
    assert len(engine.states) == 0 and engine.export_state(contexts[0]) is None
    engine.generate(contexts, greedy(2))
    assert engine.stats()["tokens_resumed"] == 0
    with pytest.raises(ValueError, match="version 0, the model holds 1"):
        engine.import_state(state)
