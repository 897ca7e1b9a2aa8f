"""Loss numerics at the edges: groups whose
rewards all agree get exactly zero advantage whatever the value; rewards near the float32
limit do not overflow the group statistics; aipo's gradient above the cap is cap * A; and a
log-ratio far past what exp can hold in float32 gives a finite loss and gradient."""

import itertools
import math

import pytest
import torch

from relayrl.config.loss import loss_config
from relayrl.contracts.messages import Group, Sample
from trainer_svc.batching import collate, split_uniform
from trainer_svc.losses import CORRECTIONS, LOSSES, LossInputs
from trainer_svc.losses.advantages import ADVANTAGE_ESTIMATORS, sequence_advantages
from trainer_svc.losses.ppo import whiten
from trainer_svc.losses.regularizers import KL_ESTIMATORS, kl_per_token

UNIFORM = [(0.7, 8), (3.3, 16), (-0.1, 5), (1e-30, 4), (3e38, 8), (-2.5e38, 3), (0.0, 6)]
VARIANTS = [(e, s) for e in ADVANTAGE_ESTIMATORS for s in (True, False)]


@pytest.mark.parametrize("estimator,scale", VARIANTS)
@pytest.mark.parametrize("value,n", UNIFORM)
def test_a_uniform_group_gets_exactly_zero_advantage(estimator, scale, value, n):
    rewards = torch.full((n,), value, dtype=torch.float64)
    adv = sequence_advantages(estimator, rewards, torch.zeros(n, dtype=torch.long), scale)
    assert torch.equal(adv, torch.zeros(n)), adv


@pytest.mark.parametrize("estimator,scale", VARIANTS)
def test_all_groups_uniform_gives_zeros_and_a_uniform_group_stays_zero_beside_others(
        estimator, scale):
    rewards = torch.tensor([0.7] * 8 + [3.3] * 8, dtype=torch.float64)
    groups = torch.tensor([0] * 8 + [1] * 8)
    assert torch.equal(sequence_advantages(estimator, rewards, groups, scale), torch.zeros(16))
    rewards = torch.tensor([0.7] * 8 + [1.0, 0.0, 0.5, 0.25], dtype=torch.float64)
    groups = torch.tensor([0] * 8 + [1] * 4)
    adv = sequence_advantages(estimator, rewards, groups, scale)
    assert torch.equal(adv[:8], torch.zeros(8)) and adv[8:].abs().min() > 0


@pytest.mark.parametrize("estimator,scale", VARIANTS)
def test_rewards_near_the_float32_limit_give_finite_advantages(estimator, scale):
    # the float32 sum of two 3e38 rewards is inf: group statistics run in float64. (A spread
    # past the float32 limit, 3e38 beside -3e38, leaves unscaled advantages beyond float32:
    # that step's loss is not finite and the trainer skips it, trainer_svc.objective.)
    rewards = torch.tensor([3e38, 3e38, 2e38, 0.0, 1.0, 2.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = sequence_advantages(estimator, rewards, groups, scale)
    assert adv.dtype == torch.float32 and torch.isfinite(adv).all(), adv


def test_collate_keeps_huge_rewards_and_zeroes_uniform_groups():
    def group(pid, rewards):
        return Group(pid, [Sample(prompt_id=pid, lease_id="l", worker_id="w",
                                  prompt_tokens=[1, 2], response_tokens=[3], logprobs=[-1.0],
                                  versions=[0], reward=r) for r in rewards])

    tb = collate([group(0, [0.7] * 8), group(1, [3e38, -3e38])], 0, 0, scale_rewards=True)
    assert torch.equal(tb.advantages[:8], torch.zeros(8))
    assert torch.isfinite(tb.advantages).all() and torch.isfinite(tb.rewards).all()
    assert float(tb.rewards.mean()) == pytest.approx(sum([0.7] * 8) / 10)
    # DAPO's filter agrees with the estimators on what is uniform
    _, uniform = split_uniform([group(0, [0.1 + 0.2, 0.3])])
    assert len(uniform) == 1


def test_whiten_survives_huge_values():
    x = torch.tensor([[3e38, -3e38, 1.0]])
    assert torch.isfinite(whiten(x, torch.ones_like(x))).all()


def _run(name, correction, delta, behaviour_gap=0.0, ref_gap=0.0, adv=1.0):
    """One loss on two tokens; `delta` is log(pi/pi_old) of the first token."""
    old = torch.tensor([[-1.0, -1.0]])
    logp = (old + torch.tensor([[delta, 0.0]])).requires_grad_(True)
    inp = LossInputs(logp, old, old - behaviour_gap, torch.tensor([adv]),
                     torch.ones_like(old), entropy=torch.ones_like(old),
                     ref_logprobs=old + ref_gap, values=torch.zeros_like(old, requires_grad=True),
                     old_values=torch.zeros_like(old), returns=torch.ones_like(old))
    settings = loss_config(name, correction=correction, kl_coef=0.1)
    loss, stats = LOSSES[name](inp, settings, 4)
    loss.backward()
    return loss, stats, logp.grad


@pytest.mark.parametrize("name,correction", list(itertools.product(LOSSES, CORRECTIONS)))
@pytest.mark.parametrize("gap", [100.0, -100.0, 1000.0])
@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_a_huge_log_ratio_gives_a_finite_loss_and_gradient(name, correction, gap, adv):
    for kwargs in ({"delta": gap}, {"delta": 0.0, "behaviour_gap": gap},
                   {"delta": 0.0, "ref_gap": gap}):
        loss, stats, grad = _run(name, correction, adv=adv, **kwargs)
        assert torch.isfinite(loss), (kwargs, loss)
        assert torch.isfinite(grad).all(), (kwargs, grad)
        assert all(math.isfinite(v) for v in stats.values()), (kwargs, stats)


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_kl_estimators_are_finite_for_a_huge_gap(estimator):
    logp = torch.tensor([[-1.0]], requires_grad=True)
    kl = kl_per_token(logp, torch.tensor([[99.0]]), torch.ones(1, 1), estimator)
    kl.sum().backward()
    assert torch.isfinite(kl).all() and torch.isfinite(logp.grad).all()
