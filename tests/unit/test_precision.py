"""The trainer's precision policy on the CPU (trainer_svc.precision): one update of the tiny
model under bf16 autocast keeps float32 parameters, gradients, AdamW state and
log-probabilities, and lands close to the float32 update, through both forward paths (the
shared-prompt pass and the plain one) and a value head."""

import copy

import pytest
import torch

from relayrl.config import TrainerConfig
from tests.unit.test_shared_prefix import MAX_NEW_TOKENS, varied_batch
from trainer_svc.learner import to_cpu
from trainer_svc.objective import Objective

# bf16 keeps 8 bits of mantissa. Measured on this batch: log-probabilities (about -3) move by
# 2e-3 at most, the loss by 6e-6, the gradient norm by 0.04%, and one AdamW step has a cosine
# of 0.996 with float32's; the bounds leave room for other machines' kernels.
LOGP_TOL = 0.01
LOSS_TOL = 1e-3
GRAD_TOL = 0.02
STEP_COS = 0.95


def one_update(lm, precision: str, **settings):
    torch.manual_seed(0)
    model = copy.deepcopy(lm.model)
    tc = TrainerConfig(precision=precision, optimizer={"lr": 1e-3}, **settings)
    objective = Objective(tc, model, MAX_NEW_TOKENS, temperature=1.0)
    optimizer = torch.optim.AdamW([*model.parameters(), *objective.parameters()],
                                  lr=tc.optimizer.lr)
    # the update frees the gradients after its step: their dtypes are read just before it
    optimizer.grad_dtypes = set()
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: opt.grad_dtypes.update(
        p.grad.dtype for g in opt.param_groups for p in g["params"] if p.grad is not None))
    model.train()
    result = objective.update(model, optimizer, varied_batch(lm))
    model.eval()
    return objective, result, model, optimizer


def assert_float32_state(model, optimizer) -> None:
    """What the bf16 policy keeps in float32: parameters, gradients, AdamW's moments."""
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert optimizer.grad_dtypes == {torch.float32}
    assert {v.dtype for s in optimizer.state.values() for k, v in s.items()
            if k != "step"} == {torch.float32}


@pytest.mark.parametrize("settings", [
    {}, {"shared_prefix": False}, {"loss": {"name": "ppo", "kl_coef": 0.05}}])
def test_a_bf16_update_keeps_float32_state_and_stays_close_to_float32(tiny_lm, settings):
    _, exact, exact_model, _ = one_update(tiny_lm, "fp32", **settings)
    objective, bf16, model, optimizer = one_update(tiny_lm, "bf16", **settings)
    assert objective.precision.name == "bf16"
    assert_float32_state(model, optimizer)
    assert bf16.old_logprobs.dtype == torch.float32
    mask = varied_batch(tiny_lm).response_mask > 0
    gap = (bf16.old_logprobs - exact.old_logprobs)[mask].abs()
    assert 0 < gap.max().item() < LOGP_TOL  # autocast ran; bf16 rounding stays small
    assert bf16.stats["loss"] == pytest.approx(exact.stats["loss"], abs=LOSS_TOL)
    assert bf16.stats["grad_norm"] == pytest.approx(exact.stats["grad_norm"], rel=GRAD_TOL)
    start = tiny_lm.model.state_dict()
    after, exact_after = to_cpu(model.state_dict()), to_cpu(exact_model.state_dict())
    moved = torch.cat([(after[k] - start[k]).flatten() for k in start])
    exact_moved = torch.cat([(exact_after[k] - start[k]).flatten() for k in start])
    assert torch.isfinite(moved).all()
    assert torch.nn.functional.cosine_similarity(moved, exact_moved, dim=0) > STEP_COS


def test_fp32_and_auto_on_the_cpu_run_without_autocast(tiny_lm):
    for spec in ("fp32", "auto"):
        objective, result, _, _ = one_update(tiny_lm, spec)
        assert objective.precision.autocast_dtype is None
    _, again, _, _ = one_update(tiny_lm, "fp32")
    assert torch.equal(result.old_logprobs, again.old_logprobs)
