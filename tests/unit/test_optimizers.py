"""trainer.optimizer: AdamW by default, Adafactor by `kind`. Adafactor keeps a row and a
column per matrix where AdamW keeps two moments per parameter; either steps the policy
through the trainer's update; a checkpoint resumes only into the optimizer that wrote it."""

import copy

import pytest
import torch

from relayrl.config import AdafactorConfig, AdamWConfig, ConfigError, RunConfig, TrainerConfig
from relayrl.config.base import load_model
from tests.unit.test_losses_trainer import tiny_batch
from trainer_svc.learner import Learner, checkpoint_optimizer_kind


def run_config(optimizer) -> RunConfig:
    return RunConfig.model_validate({"trainer": {"optimizer": optimizer}})


def test_a_mapping_without_a_kind_is_adamw_and_a_name_is_short_for_its_kind():
    assert isinstance(TrainerConfig().optimizer, AdamWConfig)
    assert run_config({"lr": 1e-4}).trainer.optimizer == AdamWConfig(lr=1e-4)
    assert run_config("adafactor").trainer.optimizer == AdafactorConfig()


@pytest.mark.parametrize("optimizer, named", [
    ({"kind": "adafactor", "betas": [0.9, 0.99]}, "'betas' is not a field of optimizer "
     "'adafactor' (a field of adamw)"),
    ({"kind": "adamw", "beta2_decay": -0.5}, "a field of adafactor"),
    ({"betas": [0.9, 1.0]}, "each beta must be in [0, 1), got 1.0"),
    ({"kind": "sgd"}, "trainer.optimizer"),
])
def test_a_field_of_another_optimizer_or_a_bad_value_is_refused_by_name(optimizer, named):
    with pytest.raises(ConfigError) as err:
        load_model(RunConfig, {"trainer": {"optimizer": optimizer}}, "run.yaml")
    assert named in str(err.value)


def state_numel(optimizer: torch.optim.Optimizer, param: torch.nn.Parameter) -> int:
    return sum(t.numel() for t in optimizer.state[param].values()
               if isinstance(t, torch.Tensor) and t.dim() > 0)


@pytest.mark.parametrize("kind", ["adamw", "adafactor"])
def test_each_optimizer_steps_the_policy_and_keeps_its_own_state(tiny_lm, kind):
    torch.manual_seed(0)
    learner = Learner(run_config({"kind": kind, "lr": 1e-2}).trainer_part(), copy.deepcopy(tiny_lm))
    before = {k: v.clone() for k, v in learner.lm.model.state_dict().items()}

    learner.update(tiny_batch(tiny_lm))

    after = learner.lm.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    matrices = [p for p in learner.lm.model.parameters() if p.dim() == 2]
    for p in matrices:
        kept = state_numel(learner.optimizer, p)
        if kind == "adamw":
            assert kept == 2 * p.numel()
        else:  # a row and a column
            assert kept == p.shape[0] + p.shape[1]


def test_a_checkpoint_resumes_into_the_optimizer_that_wrote_it(tiny_lm):
    torch.manual_seed(0)
    adamw = Learner(run_config({"lr": 1e-2}).trainer_part(), copy.deepcopy(tiny_lm))
    adamw.update(tiny_batch(tiny_lm))
    state = adamw.training_state()
    assert checkpoint_optimizer_kind(state.optimizer) == "adamw"

    adafactor = Learner(run_config("adafactor").trainer_part(), copy.deepcopy(tiny_lm))
    with pytest.raises(ValueError, match="optimizer state is adamw's and "
                       "trainer.optimizer.kind is 'adafactor'"):
        adafactor.restore(state.objective, state.model, state.optimizer)

    again = Learner(run_config({"lr": 1e-2}).trainer_part(), copy.deepcopy(tiny_lm))
    again.restore(state.objective, state.model, state.optimizer)
    for p, q in zip(adamw.lm.model.parameters(), again.lm.model.parameters(), strict=True):
        for key, value in adamw.optimizer.state[p].items():
            assert torch.equal(value, again.optimizer.state[q][key])


def test_adafactor_state_round_trips_through_a_checkpoint(tiny_lm):
    torch.manual_seed(0)
    first = Learner(run_config({"kind": "adafactor", "lr": 1e-2}).trainer_part(),
                    copy.deepcopy(tiny_lm))
    batch = tiny_batch(tiny_lm)
    first.update(batch)
    state = copy.deepcopy(first.training_state())  # in one process it holds live tensors
    assert checkpoint_optimizer_kind(state.optimizer) == "adafactor"
    resumed = Learner(run_config({"kind": "adafactor", "lr": 1e-2}).trainer_part(),
                      copy.deepcopy(tiny_lm))
    resumed.restore(state.objective, state.model, state.optimizer)

    first.update(batch)
    resumed.update(batch)

    for (name, p), q in zip(first.lm.model.named_parameters(),
                            resumed.lm.model.parameters(), strict=True):
        assert torch.equal(p, q), name
