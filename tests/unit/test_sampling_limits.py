"""Sampling values and prompt sizes are checked against what the engines honour, once, at every
surface: the run config, the live settings (as sent and as stored in Redis), the engines'
sampling spec, custom-rollout requests (gRPC Generate and HTTP share CustomGenerator.request)
and the prompts a worker leases."""

import json
import logging
import math

import pytest
import torch
from pydantic import ValidationError

from relayrl.config import RolloutConfig, RunConfig
from relayrl.config.rollout import MAX_SEED, MIN_TEMPERATURE
from relayrl.contracts import control
from relayrl.contracts.leases import LeasedPrompt
from relayrl_torch.sampling.sampler import sample
from rollout_svc.engines.api import SamplingSpec
from rollout_svc.engines.torch import TorchEngine
from rollout_svc.group_generator import GroupGenerator, PromptTooLong
from rollout_svc.serving.generator import CustomGenerator

LOW = 1e-300  # what crash-looped the workers and made the trainer's weights NaN


@pytest.mark.parametrize("value", [LOW, 0.0, -1.0, math.nan, math.inf, 10.5])
def test_config_and_live_settings_refuse_a_temperature_engines_cannot_honour(value):
    with pytest.raises(ValidationError, match="temperature"):
        RolloutConfig(temperature=value)
    with pytest.raises(ValidationError, match="temperature"):
        control.SettingsChange(temperature=value)
    assert RolloutConfig(temperature=MIN_TEMPERATURE).temperature == MIN_TEMPERATURE


@pytest.mark.parametrize("body", [{"max_staleness": True}, {"max_staleness": "1"},
                                  {"max_staleness": 1.5}, {"temperature": "0.5"},
                                  {"temperature": False}])
def test_live_settings_take_no_coerced_values(body):
    with pytest.raises(ValidationError, match=next(iter(body))):
        control.SettingsChange.model_validate(body)


def test_a_bad_stored_setting_keeps_the_configs_value_and_is_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(control, "_refused", set())  # other tests in this process met 1e-300
    cfg = RunConfig.model_validate({"rollout": {"temperature": 0.9},
                                    "trainer": {"max_staleness": 2}})
    stored = {b"temperature": json.dumps(LOW).encode(), b"max_staleness": b"5"}
    with caplog.at_level(logging.ERROR, logger="relayrl.contracts.control"):
        for _ in range(3):  # every segment reads it: one line, not one per read
            settings = control.settings_from_hash(stored, cfg.live_defaults())
    assert (settings.temperature, settings.max_staleness) == (0.9, 5)  # the good one applies
    refusals = [r for r in caplog.records if "temperature" in r.getMessage()]
    assert len(refusals) == 1 and "1e-300" in refusals[0].getMessage()
    garbage = {"temperature": b"not json", "max_staleness": b"true"}
    defaults = cfg.live_defaults()
    assert control.settings_from_hash(garbage, defaults) == control.configured_settings(defaults)


@pytest.mark.parametrize("spec", [dict(temperature=LOW), dict(temperature=math.nan),
                                  dict(temperature=0.0), dict(seed=MAX_SEED + 1)])
def test_the_engines_spec_refuses_what_no_engine_honours(spec):
    with pytest.raises(ValueError, match=next(iter(spec))):
        SamplingSpec(max_new_tokens=4, **spec)


def test_sampling_at_the_floor_is_finite_for_sharp_logits(tiny_lm):
    """At the lowest temperature, with logits scaled up as a sharp model's are, every token
    comes from a finite distribution (no NaN from the sampler, no error)."""
    model = tiny_lm.model

    class Sharp(torch.nn.Module):
        config = model.config

        def forward(self, **kw):
            out = model(**kw)
            out.logits = out.logits * 1e4
            return out

    outs = sample(Sharp(), [[1, 5, 6], [1, 7]], max_new_tokens=6, eos_ids=(),
                  pad_id=tiny_lm.pad_id, temperature=MIN_TEMPERATURE,
                  generator=torch.Generator().manual_seed(0))
    assert all(len(o.tokens) == 6 and all(map(math.isfinite, o.logprobs)) for o in outs)


@pytest.fixture(scope="module")
def gen(tiny_lm):
    limits = RolloutConfig(max_new_tokens=8, max_prompt_tokens=300, max_request_bytes=2048)
    return CustomGenerator(TorchEngine(tiny_lm, seed=0), tiny_lm, limits)


@pytest.mark.parametrize("kw,message", [
    (dict(temperature=LOW), r"GenerateRequest.temperature: must be 0 or in \[0.01, 10.0\], "
                            r"got 1e-300"),
    (dict(temperature=math.nan), "temperature: .* got nan"),
    (dict(temperature=-0.5), "temperature: .* got -0.5"),
    (dict(seed=2**70), f"seed: must be in 0..{MAX_SEED}, got {2**70}"),
    (dict(seed=-1), "seed: .* got -1"),
    (dict(token_ids=[5] * 301), r"token_ids: 301 tokens, more than rollout.max_prompt_tokens "
                                r"\(300\)"),
    (dict(token_ids=[5] * 260), "token_ids: 260 tokens leave no room to generate in the "
                                "model's context of 256 tokens"),
    (dict(token_ids=[5] * 250, max_new_tokens=8), r"max_new_tokens: 250 prompt tokens \+ 8 "
                                                  r"exceed the model's context length \(256\)"),
    (dict(text="1" * 3000), r"text: 3000 bytes, more than rollout.max_request_bytes \(2048\)"),
])
def test_generate_requests_name_field_value_and_limit(gen, kw, message):
    kw = {"text": "1+1=", **kw} if "token_ids" not in kw else kw
    with pytest.raises(ValueError, match=message):
        gen.request(where="GenerateRequest", **kw)


def test_an_unasked_budget_is_what_the_context_leaves(gen):
    req = gen.request(token_ids=[5] * 250)
    assert req.spec.max_new_tokens == 6  # 256 - 250, under rollout.max_new_tokens (8)
    assert gen.request(text="1+1=", seed=MAX_SEED).spec.seed == MAX_SEED
    assert gen.request(text="1+1=", temperature=MIN_TEMPERATURE).spec.temperature == 0.01


def test_a_leased_prompt_too_long_is_refused_never_cut(tiny_lm):
    cfg = RunConfig.model_validate({"rollout": {"max_new_tokens": 6, "max_prompt_tokens": 100}})
    groups = GroupGenerator(cfg.rollout_part(), TorchEngine(tiny_lm), tiny_lm, writer=None)
    with pytest.raises(PromptTooLong, match="prompt 3: 601 tokens, more than the 100"):
        groups.start(LeasedPrompt("L1", 3, "12+34=" * 100, "46", attempt=1))
    near = RunConfig.model_validate({"rollout": {"max_new_tokens": 200}})
    near_groups = GroupGenerator(near.rollout_part(), TorchEngine(tiny_lm), tiny_lm, writer=None)
    assert near_groups.prompt_limit == 56
    none_left = RunConfig.model_validate({"rollout": {"max_new_tokens": 256}})
    with pytest.raises(ValueError, match="rollout.max_new_tokens: 256 leaves no room"):
        GroupGenerator(none_left.rollout_part(), TorchEngine(tiny_lm), tiny_lm, writer=None)


def test_an_engine_holding_less_than_the_configured_window_is_refused(tiny_lm):
    """The task measured its prompts against the configured window; a worker whose engine
    holds less would have to cut them, so it does not start."""
    engine = TorchEngine(tiny_lm)
    engine.context_length = 200  # as a vLLM engine that settled on a shorter window
    cfg = RunConfig.model_validate({"rollout": {"max_new_tokens": 8}})
    assert cfg.prompt_window().longest == 248
    with pytest.raises(ValueError, match="engine holds 200 tokens, so prompts of at most 192, "
                                         "fewer than the 248"):
        GroupGenerator(cfg.rollout_part(), engine, tiny_lm, writer=None)
