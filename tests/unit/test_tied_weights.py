"""Tied parameters travel once (relayrl_torch.weights.tied): the trainer publishes a tied output
embedding under its first name only, and every consumer (the torch engine, the evaluation
follower) loads it whole from that, and still refuses a version missing anything else."""

import copy

import pytest
import torch

from relayrl.config import RunConfig
from relayrl_torch.weights.tied import load_published, tied_aliases, without
from rollout_svc.engines.torch import TorchEngine
from trainer_svc.learner import Learner


def test_a_tied_output_embedding_is_an_alias_on_any_device(tiny_lm):
    assert tied_aliases(tiny_lm.model) == {"lm_head.weight": "model.embed_tokens.weight"}
    with torch.device("meta"):
        meta = type(tiny_lm.model)(tiny_lm.model.config)
    assert tied_aliases(meta) == {"lm_head.weight": "model.embed_tokens.weight"}
    untied = copy.deepcopy(tiny_lm.model)
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    assert tied_aliases(untied) == {}


def test_the_trainer_publishes_each_tensor_once(tiny_lm):
    learner = Learner(RunConfig().trainer_part(), copy.deepcopy(tiny_lm))
    weights = learner.weights()
    assert "lm_head.weight" not in weights
    assert set(weights) == set(tiny_lm.model.state_dict()) - {"lm_head.weight"}


@pytest.mark.parametrize("with_alias", [False, True])
def test_the_engine_loads_the_alias_from_its_first_name(tiny_lm, with_alias):
    engine = TorchEngine(copy.deepcopy(tiny_lm))
    state = {k: v.clone() for k, v in tiny_lm.model.state_dict().items()}
    state["model.embed_tokens.weight"] += 1.0
    alias = {"lm_head.weight": "model.embed_tokens.weight"}
    published = state if with_alias else without(state, alias)
    engine.load_weights(published, 1)
    model = engine.lm.model
    assert torch.equal(model.lm_head.weight, state["model.embed_tokens.weight"])
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_version_missing_anything_else_is_refused(tiny_lm):
    model = copy.deepcopy(tiny_lm.model)
    state = without(dict(model.state_dict()), tied_aliases(model))
    del state["model.norm.weight"]
    with pytest.raises(ValueError, match="model.norm.weight"):
        load_published(model, state)
    with pytest.raises(ValueError, match="model.norm.weight"):
        TorchEngine(copy.deepcopy(tiny_lm)).load_weights(state, 1)
    extra = {**dict(model.state_dict()), "bonus.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match="bonus.weight"):
        load_published(model, extra)
