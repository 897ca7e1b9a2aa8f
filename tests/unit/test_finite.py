"""Nothing non-finite leaves the trainer: an update whose loss is not
finite takes no optimizer step and leaves no gradient; the checkpoint writer and the
publisher refuse weights holding a NaN or an inf, writing and sending nothing."""

import copy

import pytest
import torch

from relay_svc.version_store import VersionStore
from relayrl.config import TrainerConfig
from tests.unit.test_losses_trainer import MAX_NEW_TOKENS, tiny_batch
from trainer_svc import checkpoint
from trainer_svc.finite import NonFiniteError, StepGuard, check_finite, is_finite, nonfinite_tensors
from trainer_svc.learner import TrainingState
from trainer_svc.objective import Objective
from trainer_svc.publisher import AsyncPublisher


@pytest.mark.parametrize("updates", [1, 2])
def test_an_update_with_a_nonfinite_loss_changes_nothing(tiny_lm, updates):
    model = copy.deepcopy(tiny_lm.model)
    objective = Objective(TrainerConfig(updates_per_batch=updates), model, MAX_NEW_TOKENS,
                          temperature=1e-300)  # logits / 1e-300 overflow: the loss is NaN
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = []
    result = objective.update(model, optimizer, tiny_batch(tiny_lm), lambda: calls.append(1))
    assert result.nonfinite and calls == []  # nothing to fence: the weights do not change
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and not optimizer.state

    objective.temperature = 1.0
    assert not objective.update(model, optimizer, tiny_batch(tiny_lm)).nonfinite


def _state(model, value: float) -> TrainingState:
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    next(iter(weights.values()))[0] = value
    return TrainingState(weights, {}, {"state": {}, "param_groups": []}, False)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_the_checkpoint_writer_refuses_nonfinite_weights(tiny_lm, tmp_path, bad):
    model = tiny_lm.model
    good = checkpoint.save(tmp_path, 1, model, _state(model, 0.5), checkpoint.Ledger(),
                           {"totals": {}}, keep=2)
    with pytest.raises(NonFiniteError, match="checkpoint of step 2"):
        checkpoint.save(tmp_path, 2, model, _state(model, bad), checkpoint.Ledger(),
                        {"totals": {}}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.name]
    assert checkpoint.latest(tmp_path) == good


def test_the_publisher_refuses_nonfinite_weights_and_says_so():
    store = VersionStore(4)
    pub = AsyncPublisher(store)
    pub.publish(1, 1, {"w": torch.ones(3)})
    pub.wait()
    pub.publish(2, 2, {"w": torch.tensor([1.0, float("nan"), 0.0])})
    with pytest.raises(NonFiniteError, match="publish version 2: tensors w"):
        pub.wait()
    assert store.versions() == [1] and pub.failures == 1
    with pytest.raises(NonFiniteError):  # and every later publish, until the trainer stops
        pub.publish(3, 3, {"w": torch.ones(3)})
    with pytest.raises(NonFiniteError):
        pub.close()


def test_check_finite_names_the_tensors_and_ignores_integers():
    check_finite({"ids": torch.tensor([1, 2]), "w": torch.zeros(2)}, "x")
    with pytest.raises(NonFiniteError, match="tensors a, c hold"):
        check_finite({"a": torch.tensor([float("inf")]), "b": torch.zeros(1),
                      "c": torch.tensor([float("nan")])}, "x")


def test_the_step_guard_counts_skips_in_a_row():
    guard = StepGuard(limit=2)
    guard.skipped(5, float("nan"), float("nan"), "ckpt")
    guard.passed()
    guard.skipped(7, float("nan"), float("inf"), "ckpt")
    with pytest.raises(NonFiniteError, match="2 steps in a row at step 8.*"
                                             "trainer.max_nonfinite_steps is 2.*ckpt"):
        guard.skipped(8, float("inf"), float("nan"), "ckpt")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_the_finite_check_is_exact_when_a_sum_overflows_or_cancels(dtype):
    big = torch.finfo(dtype).max
    overflowing = torch.tensor([big, big, -1.0], dtype=dtype)  # finite; its sum is inf
    assert torch.isinf(overflowing.sum()) and is_finite(overflowing)
    assert nonfinite_tensors({"w": overflowing}) == []
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = torch.zeros(1000, dtype=dtype)
        t[537] = bad
        assert not is_finite(t)
        assert nonfinite_tensors({"ok": torch.ones(4, dtype=dtype), "w": t}) == ["w"]
    cancelling = torch.tensor([float("inf"), -float("inf")], dtype=dtype)  # sum: nan
    assert not is_finite(cancelling)
