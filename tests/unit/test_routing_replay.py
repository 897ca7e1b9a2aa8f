"""Routing replay: the torch engine records each fed position's experts, samples carry them
through the wire and the buffer's checks, and the trainer's forward takes them in place of
its routers' top-k; a dense model is unaffected."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from buffer_svc.submit import SubmitLimits, to_samples
from relayrl.config import ModelLimits, RunConfig, read_model_limits
from relayrl.contracts.codec import CodecError
from relayrl.contracts.messages import (
    Group,
    Sample,
    SampleLimits,
    decode_group,
    encode_group,
    validate_sample,
)
from relayrl.contracts.partial import PartialGroup
from relayrl.contracts.proto.v1 import buffer_pb2
from relayrl_testkit.families import family_config
from relayrl_torch.models.loading import LoadedModel, load_model
from relayrl_torch.models.routing import expert_count, replayed, routers
from rollout_svc.engines.api import SamplingSpec
from rollout_svc.engines.torch import TorchEngine
from trainer_svc.batching import collate, policy_outputs
from trainer_svc.quarantine import group_problem, live_limits
from trainer_svc.shared_prefix import prompt_sharing, shared_prefix_outputs

EXPERTS = ("qwen2_moe", "qwen3_moe", "mixtral")


def family_lm(tmp_path, tiny_lm, family: str) -> LoadedModel:
    """A random model of `family` over the tiny tokenizer, saved and loaded as a run would."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config(family, tiny_lm.tokenizer))
    out = tmp_path / family
    model.save_pretrained(out)
    tiny_lm.tokenizer.save_pretrained(out)
    return load_model(out)


def sampled(lm: LoadedModel, contexts: list[list[int]], tokens: int = 5,
            dtype: torch.dtype = torch.float32) -> list[Group]:
    """One group per context: two samples the torch engine drew, with their routes."""
    lm = LoadedModel(lm.model.to(dtype), lm.tokenizer, lm.path)
    engine = TorchEngine(lm, seed=1, record_routes=True, kv_cache_tokens=1024)
    outs = engine.generate([c for c in contexts for _ in range(2)],
                           SamplingSpec(max_new_tokens=tokens, ignore_eos=True))
    lm.model.float()
    return [Group(i, [Sample(prompt_id=i, lease_id="L", worker_id="w", prompt_tokens=c,
                             response_tokens=o.tokens, logprobs=o.logprobs,
                             versions=[0] * len(o.tokens), reward=float(k), routes=o.routes)
                      for k, o in enumerate(outs[2 * i:2 * i + 2])])
            for i, c in enumerate(contexts)]


CONTEXTS = [[1, 5, 6, 7, 8, 9], [1, 6], [1, 7, 7, 8]]


@pytest.mark.parametrize("family", EXPERTS)
def test_the_engine_records_every_fed_positions_experts(tmp_path, tiny_lm, family):
    lm = family_lm(tmp_path, tiny_lm, family)
    layers, experts, top_k = expert_count(lm.model)
    assert (layers, experts, top_k) == (2, 4, 2)
    assert read_model_limits(lm.path).experts == (2, 4, 2)
    for g in sampled(lm, CONTEXTS):
        for s in g.samples:
            fed = len(s.prompt_tokens) + len(s.response_tokens) - 1
            assert s.routes.shape == (layers, fed, top_k) and s.routes.dtype == np.uint8
            assert s.routes.max() < experts
            # each position's experts are distinct: a top-k, not a draw
            assert (np.sort(s.routes, -1)[..., 1:] != np.sort(s.routes, -1)[..., :-1]).all()
            validate_sample(s, SampleLimits(lm.tokenizer.vocab_size + 8, 512, "m", (0, 1), 0,
                                            (layers, experts, top_k)))


@pytest.mark.parametrize("family", EXPERTS)
def test_replaying_the_engines_own_routes_gives_the_engines_logprobs(tmp_path, tiny_lm,
                                                                     family):
    lm = family_lm(tmp_path, tiny_lm, family)
    groups = sampled(lm, CONTEXTS)
    tb = collate(groups, 0, lm.pad_id, True, replay=True)
    assert tb.routes.shape[2:] == (2, 2)
    with torch.no_grad():
        plain = policy_outputs(lm.model, tb, 1.0).logprobs
    mask = tb.response_mask > 0
    assert torch.allclose(plain[mask], tb.behaviour_logprobs[mask], atol=1e-5)
    # and the shared-prefix pass replays each of its passes' own positions
    with torch.no_grad():
        shared = shared_prefix_outputs(lm.model, tb, 1.0, prompt_sharing(tb)).logprobs
    assert torch.allclose(shared[mask], plain[mask], atol=1e-5)


@pytest.mark.parametrize("family", EXPERTS)
def test_the_trainers_forward_takes_the_recorded_experts(tmp_path, tiny_lm, family):
    """Routes other than the router's own change the log-probabilities, and the router still
    gets a gradient through the replayed experts' weights."""
    lm = family_lm(tmp_path, tiny_lm, family)
    tb = collate(sampled(lm, CONTEXTS), 0, lm.pad_id, True, replay=True)
    mask = tb.response_mask > 0
    other = torch.where(tb.routes >= 0, (tb.routes + 1) % 4, tb.routes)  # every expert moved
    with torch.no_grad():
        moved = policy_outputs(lm.model, dataclasses.replace(tb, routes=other), 1.0).logprobs
    assert not torch.allclose(moved[mask], tb.behaviour_logprobs[mask], atol=1e-3)
    lm.model.zero_grad()
    logp = policy_outputs(lm.model, dataclasses.replace(tb, routes=other), 1.0).logprobs
    logp[mask].sum().backward()
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0
               for r in routers(lm.model))


def test_replay_weights_the_recorded_experts_as_the_router_does(tmp_path, tiny_lm):
    """Given its own choice, the replaying router returns exactly what the router gave."""
    lm = family_lm(tmp_path, tiny_lm, "qwen3_moe")
    router = routers(lm.model)[0]
    hidden = torch.randn(1, 6, lm.model.config.hidden_size)
    logits, weights, chosen = router(hidden)
    routes = chosen.view(1, 6, 1, -1).repeat(1, 1, len(routers(lm.model)), 1)
    with replayed(lm.model, routes):
        again = router(hidden)
    assert torch.equal(again[1], weights) and torch.equal(again[2], chosen)


def test_routes_of_an_engine_in_bfloat16_replay_in_a_float32_trainer(tmp_path, tiny_lm):
    lm = family_lm(tmp_path, tiny_lm, "mixtral")
    groups = sampled(lm, CONTEXTS, tokens=8, dtype=torch.bfloat16)
    assert next(lm.model.parameters()).dtype == torch.float32
    tb = collate(groups, 0, lm.pad_id, True, replay=True)
    with torch.no_grad():
        logp = policy_outputs(lm.model, tb, 1.0).logprobs
    mask = tb.response_mask > 0
    assert (logp - tb.behaviour_logprobs).abs()[mask].max() < 0.05  # bfloat16's rounding


def test_a_dense_model_is_unaffected(tiny_lm):
    assert routers(tiny_lm.model) == [] and expert_count(tiny_lm.model) == (0, 0, 0)
    engine = TorchEngine(tiny_lm, seed=1, record_routes=True, kv_cache_tokens=1024)
    assert engine.recorder is None and engine.states.capacity_tokens == 1024
    (out,) = engine.generate([[1, 5, 6]], SamplingSpec(max_new_tokens=3))
    assert out.routes is None
    s = Sample(prompt_id=0, lease_id="L", worker_id="w", prompt_tokens=[1, 5, 6],
               response_tokens=out.tokens, logprobs=out.logprobs, versions=[0] * 3, reward=0.0)
    tb = collate([Group(0, [s])], 0, tiny_lm.pad_id, True, replay=True)
    assert tb.routes.shape[2:] == (0, 0)
    with torch.no_grad():
        replaying = policy_outputs(tiny_lm.model, tb, 1.0).logprobs
        plain = policy_outputs(tiny_lm.model, collate([Group(0, [s])], 0, tiny_lm.pad_id,
                                                      True), 1.0).logprobs
    assert torch.equal(replaying, plain)


def test_a_sample_without_routes_is_routed_by_the_trainer(tmp_path, tiny_lm):
    lm = family_lm(tmp_path, tiny_lm, "qwen2_moe")
    groups = sampled(lm, CONTEXTS)
    bare = groups[1].samples[0]
    bare.routes = None
    tb = collate(groups, 0, lm.pad_id, True, replay=True)
    assert (tb.routes[2] == -1).all() and (tb.routes[0] >= 0).any()
    with torch.no_grad():
        logp = policy_outputs(lm.model, tb, 1.0).logprobs
    mask = tb.response_mask > 0
    assert torch.allclose(logp[mask], tb.behaviour_logprobs[mask], atol=1e-5)


def sample_with(routes, prompt=(1, 5, 6), response=(7, 8)) -> Sample:
    return Sample(prompt_id=0, lease_id="L", worker_id="w", prompt_tokens=list(prompt),
                  response_tokens=list(response), logprobs=[-1.0] * len(response),
                  versions=[0] * len(response), reward=0.0, routes=routes)


LIMITS = SampleLimits(16, 64, "the model", (0.0, 1.0), 0, (2, 4, 2))


def test_routes_are_checked_where_a_sample_enters_naming_the_field():
    good = np.zeros((2, 4, 2), dtype=np.uint8)
    validate_sample(sample_with(good), LIMITS)
    with pytest.raises(CodecError, match=r"sample.routes: 3 positions for 4 fed tokens"):
        validate_sample(sample_with(good[:, :3]))
    with pytest.raises(CodecError, match=r"sample.routes: must be \[layers, tokens, top_k\]"):
        sample_with(np.zeros((2, 4), dtype=np.uint8))
    with pytest.raises(CodecError, match=r"sample.routes\[0\]: -1 is below 0"):
        sample_with(np.full((2, 4, 2), -1, dtype=np.int16))
    with pytest.raises(CodecError, match=r"sample.routes: expected integers, got float"):
        sample_with(np.zeros((2, 4, 2), dtype=np.float32))
    bad = good.copy()
    bad[1, 2, 0] = 4
    with pytest.raises(CodecError, match=r"sample.routes\[1, 2, 0\]: expert 4 is outside "
                                         r"\[0, 4\) \(the model\)"):
        validate_sample(sample_with(bad), LIMITS)
    with pytest.raises(CodecError, match=r"\[3, 4, 2\] for a model of 2 expert layers, top_k 2"):
        validate_sample(sample_with(np.zeros((3, 4, 2), dtype=np.uint8)), LIMITS)
    with pytest.raises(CodecError, match=r"sample.routes: the model \(the model\) has no "
                                         "mixture of experts"):
        validate_sample(sample_with(good), dataclasses.replace(LIMITS, experts=(0, 0, 0)))


def test_routes_travel_the_wire_in_their_compact_dtype():
    routes = np.arange(16, dtype=np.uint8).reshape(2, 4, 2) % 4
    (back,) = decode_group(encode_group(Group(0, [sample_with(routes)]))).samples
    assert back.routes.dtype == np.uint8 and np.array_equal(back.routes, routes)
    wide = np.full((1, 4, 2), 300, dtype=np.int16)
    assert sample_with(wide).routes.dtype == np.int16
    assert decode_group(encode_group(Group(0, [sample_with(None)]))).samples[0].routes is None
    group = PartialGroup.fresh(0, [1, 5, 6], 1)
    group.sequences[0].extend([7, 8], [-1.0, -1.0], 0, routes)
    again = PartialGroup.decode(group.encode(), 0, 1)
    assert np.array_equal(again.sequences[0].routes, routes)


def trajectory(**routes) -> buffer_pb2.Trajectory:
    t = buffer_pb2.Trajectory(prompt_tokens=[1, 5, 6], response_tokens=[7, 8],
                              logprobs=[-1.0, -1.0], versions=[0, 0], reward=0.5)
    if routes:
        t.routes.CopyFrom(buffer_pb2.ExpertRoutes(**routes))
    return t


def test_buffer_submit_takes_routes_and_refuses_those_that_do_not_fit():
    limits = SubmitLimits(1, ModelLimits(16, 64, "the model", (2, 4, 2)), (0.0, 1.0))
    experts = list(range(4)) * 4
    (s,) = to_samples(buffer_pb2.SubmitRequest(trajectories=[
        trajectory(layers=2, top_k=2, experts=experts)]), limits, 0)
    assert s.routes.shape == (2, 4, 2) and s.routes[0, 1].tolist() == [2, 3]
    (bare,) = to_samples(buffer_pb2.SubmitRequest(trajectories=[trajectory()]), limits, 0)
    assert bare.routes is None
    for routes, message in [
        (dict(layers=2, top_k=2, experts=experts[:15]),
         r"trajectories\[0\].routes: 15 experts do not make \[layers 2, tokens, top_k 2\]"),
        (dict(layers=2, top_k=2, experts=experts[:12]),
         r"trajectories\[0\].routes: 3 positions for 4 fed tokens"),
        (dict(layers=2, top_k=2, experts=[9] * 16),
         r"trajectories\[0\].routes\[0, 0, 0\]: expert 9 is outside \[0, 4\)"),
    ]:
        with pytest.raises(CodecError, match=message):
            to_samples(buffer_pb2.SubmitRequest(trajectories=[trajectory(**routes)]), limits,
                       0)


def test_the_trainer_quarantines_routes_that_do_not_fit_its_model(tmp_path, tiny_lm):
    lm = family_lm(tmp_path, tiny_lm, "qwen2_moe")
    limits = live_limits(lm.model)
    assert limits.experts == (2, 4, 2)
    assert group_problem(Group(0, [sample_with(np.zeros((2, 4, 2), np.uint8))]), limits) is None
    assert "routes: shape (1, 4, 2) does not fit" in group_problem(
        Group(0, [sample_with(np.zeros((1, 4, 2), np.uint8))]), limits)
    assert "routes: shape (2, 4, 2) does not fit" in group_problem(
        Group(0, [sample_with(np.zeros((2, 4, 2), np.uint8))]), live_limits(tiny_lm.model))


def test_routing_replay_is_handed_to_the_rollout_worker():
    assert RunConfig().rollout_part().routing_replay is True
    cfg = RunConfig.model_validate({"trainer": {"routing_replay": False}})
    assert cfg.rollout_part().routing_replay is False
