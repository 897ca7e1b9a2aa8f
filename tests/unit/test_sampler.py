"""The sampler's recorded log-probabilities equal the trainer's recomputation."""

import torch

from relayrl.messages import Group, Sample
from relayrl.sampling.sampler import sample
from trainer_svc.batching import collate, token_logprobs


def test_sampled_logprobs_match_trainer_recompute(tiny_lm):
    prompts = [tiny_lm.encode_prompt(t) for t in ("1+2=", "35+47=", "9+80=")]
    gen = torch.Generator().manual_seed(0)
    outs = sample(tiny_lm.model, prompts, max_new_tokens=5, eos_id=tiny_lm.eos_id,
                  pad_id=tiny_lm.pad_id, temperature=0.7, generator=gen)
    samples = [Sample(prompt_id=i, lease_id="L", worker_id="w", prompt_tokens=p,
                      response_tokens=o.tokens, logprobs=o.logprobs, versions=[0] * len(o.tokens),
                      reward=0.0)
               for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]
    tb = collate([Group(i, [s]) for i, s in enumerate(samples)], 0, tiny_lm.pad_id, True)
    with torch.no_grad():
        recomputed = token_logprobs(tiny_lm.model, tb, temperature=0.7)
    diff = ((recomputed - tb.behaviour_logprobs).abs() * tb.response_mask).max().item()
    assert diff < 1e-4
    assert tb.response_mask.sum().item() == sum(len(o.tokens) for o in outs)


def test_greedy_is_deterministic_and_respects_the_length_cap(tiny_lm):
    p = [tiny_lm.encode_prompt("12+34=")]
    kw = dict(max_new_tokens=3, eos_id=tiny_lm.eos_id, pad_id=tiny_lm.pad_id, greedy=True)
    a, b = sample(tiny_lm.model, p, **kw), sample(tiny_lm.model, p, **kw)
    assert a[0].tokens == b[0].tokens
    assert len(a[0].tokens) <= 3
    if tiny_lm.eos_id not in a[0].tokens:
        assert a[0].finish_reason == "length"
