"""Every end-of-sequence id a model names ends a response: the tokenizer's, and those of its
generation_config.json and config.json (a chat model's end-of-turn token is often only there)."""

from __future__ import annotations

import json

from relayrl_torch.models.loading import eos_ids
from relayrl_torch.sampling.sampler import sample


def test_the_ids_come_from_the_tokenizer_generation_config_and_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128009, 2]}))
    assert eos_ids(tmp_path, 128001) == (128001, 128009, 2)
    assert eos_ids(tmp_path) == (128009, 2)


def test_unreadable_or_odd_values_are_skipped(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [True, -1, "3", 5]}))
    (tmp_path / "generation_config.json").write_text("not json")
    assert eos_ids(tmp_path, None) == (5,)
    assert eos_ids(tmp_path / "missing", 7) == (7,)


def test_any_of_the_ids_ends_a_sampled_response(tiny_lm):
    prompt = [tiny_lm.tokenizer.bos_token_id or 1, 5, 6]
    (free,) = sample(tiny_lm.model, [prompt], max_new_tokens=6, eos_ids=(), pad_id=0,
                     greedy=True)
    second = free.tokens[1]
    (ended,) = sample(tiny_lm.model, [prompt], max_new_tokens=6, eos_ids=(-5, second),
                      pad_id=0, greedy=True)
    assert ended.tokens == free.tokens[:free.tokens.index(second) + 1]
    assert ended.finish_reason == "stop"
