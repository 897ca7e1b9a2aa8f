"""The sampler's recorded log-probabilities equal the trainer's recomputation."""

import torch

from relayrl.contracts.messages import Group, Sample
from relayrl_torch.sampling.sampler import sample
from trainer_svc.batching import collate, token_logprobs


def test_sampled_logprobs_match_trainer_recompute(tiny_lm):
    prompts = [tiny_lm.encode_prompt(t) for t in ("1+2=", "35+47=", "9+80=")]
    gen = torch.Generator().manual_seed(0)
    outs = sample(tiny_lm.model, prompts, max_new_tokens=5, eos_ids=tiny_lm.eos_ids,
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
    kw = dict(max_new_tokens=3, eos_ids=tiny_lm.eos_ids, pad_id=tiny_lm.pad_id, greedy=True)
    a, b = sample(tiny_lm.model, p, **kw), sample(tiny_lm.model, p, **kw)
    assert a[0].tokens == b[0].tokens
    assert len(a[0].tokens) <= 3
    if tiny_lm.eos_id not in a[0].tokens:
        assert a[0].finish_reason == "length"


def test_repeated_prompts_are_prefilled_once_and_sample_as_if_apart(tiny_lm, monkeypatch):
    """A group's samples share their prompt: the sampler prefills each distinct context
    once; tokens and log-probabilities are those of the rows run apart."""
    from relayrl_torch.sampling import sampler

    texts = ["1+2=", "35+47=", "1+2=", "9+80=", "35+47=", "1+2="]
    prompts = [tiny_lm.encode_prompt(t) for t in texts]
    first, inverse = sampler._distinct_rows(prompts)
    assert first.tolist() == [0, 1, 3] and inverse.tolist() == [0, 1, 0, 2, 1, 0]
    assert sampler._distinct_rows(prompts[:2]) is None

    def run():
        return sample(tiny_lm.model, prompts, max_new_tokens=5, eos_ids=tiny_lm.eos_ids,
                      pad_id=tiny_lm.pad_id, temperature=0.7,
                      generator=torch.Generator().manual_seed(3))

    shared = run()
    monkeypatch.setattr(sampler, "_distinct_rows", lambda contexts: None)
    apart = run()
    for a, b in zip(shared, apart, strict=True):
        assert a.tokens == b.tokens and a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_a_group_draws_what_hugging_face_generate_draws(tiny_lm):
    """The torch engine's sampler against the field's reference, draw for draw: the same
    prompts eight times each, the same seed, and the rows come out as `generate` samples
    them (TRL's own sampling path), so a difference in learning between RelayRL and TRL is
    not the sampler's. A row may differ where a probability sits on a draw's boundary within
    float rounding (the sampler prefills each prompt once; generate runs every row)."""
    texts = ("12+34=", "56+78=", "90+12=", "33+44=")
    prompts = [tiny_lm.encode_prompt(t) for t in texts for _ in range(8)]
    for temperature in (1.0, 0.7):
        ours = sample(tiny_lm.model, prompts, max_new_tokens=5, eos_ids=tiny_lm.eos_ids,
                      pad_id=tiny_lm.pad_id, temperature=temperature,
                      generator=torch.Generator().manual_seed(7))
        torch.manual_seed(7)  # generate draws from the global generator
        ids = torch.tensor(prompts)
        with torch.no_grad():
            out = tiny_lm.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids),
                do_sample=True, top_k=0, top_p=1.0, temperature=temperature, max_new_tokens=5,
                eos_token_id=tiny_lm.eos_id, pad_token_id=tiny_lm.pad_id)
        theirs = []
        for row in out[:, len(prompts[0]):].tolist():
            theirs.append(row[:row.index(tiny_lm.eos_id) + 1] if tiny_lm.eos_id in row
                          else row)
        same = sum(o.tokens == t for o, t in zip(ours, theirs, strict=True))
        assert same >= len(prompts) - 2, (temperature, same)
        assert len({tuple(t) for t in theirs}) > len(texts)  # the rows did sample apart
