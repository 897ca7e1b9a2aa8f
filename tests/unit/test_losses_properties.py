"""Properties every loss must have, on seeded random batches (hypothesis is not a dependency
of this project, so the cases are drawn from torch generators, one per seed): invariance to
what sits at masked positions, to padding and to group order; zero gradient where the
advantage is zero or the clip binds; and the estimators against independent definitions."""

import itertools
import math

import pytest
import torch

from relayrl.config.loss import loss_config
from trainer_svc.losses import CORRECTIONS, LOSSES, LossInputs
from trainer_svc.losses.advantages import leave_one_out_advantages
from trainer_svc.losses.policy import ratio_at_level
from trainer_svc.losses.ppo import gae, terminal_rewards
from trainer_svc.losses.regularizers import KL_ESTIMATORS, kl_per_token

SEEDS = range(8)
COMBOS = list(itertools.product(LOSSES, CORRECTIONS))
SETTINGS = dict(kl_coef=0.1, entropy_coef=0.01, tis_cap=2.0)
MAX_LEN = 8


def random_case(seed: int, groups: int = 3, group_size: int = 3, width: int = 6) -> dict:
    """Tensors of one batch: response masks with holes (tokens the model did not produce),
    policies near each other, integer rewards."""
    g = torch.Generator().manual_seed(seed)
    b = groups * group_size
    lengths = torch.randint(1, width + 1, (b,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    holes = torch.rand(b, width, generator=g) < 0.2
    holes[:, 0] = False
    mask = mask * (~holes).float()

    def near(x, scale=0.3):
        return x + scale * torch.randn(x.shape, generator=g)

    old = -0.05 - 3 * torch.rand(b, width, generator=g)
    values = torch.randn(b, width, generator=g)
    return {
        "mask": mask, "old": old, "logp": near(old), "behaviour": near(old), "ref": near(old),
        "entropy": 3 * torch.rand(b, width, generator=g),
        "values": near(values, 0.1), "old_values": values,
        "rewards": torch.randint(0, 3, (b,), generator=g).float(),
        "group_ids": torch.arange(groups).repeat_interleave(group_size),
    }


def run_loss(name: str, correction: str, case: dict, **settings):
    """(loss, grad wrt logp), advantages by the loss's own estimator."""
    s = loss_config(name, correction=correction, **{**SETTINGS, **settings})
    loss_fn = LOSSES[name]
    adv, returns = loss_fn.advantages(case["rewards"], case["group_ids"], case["mask"], s,
                                      values=case["old_values"])
    logp = case["logp"].clone().requires_grad_(True)
    loss, _ = loss_fn(LossInputs(
        logp, case["old"], case["behaviour"], adv, case["mask"], entropy=case["entropy"],
        ref_logprobs=case["ref"], values=case["values"], old_values=case["old_values"],
        returns=returns), s, MAX_LEN)
    loss.backward()
    return loss.detach(), logp.grad


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name,correction", COMBOS)
def test_masked_positions_do_not_matter(name, correction, seed):
    case = random_case(seed)
    loss, grad = run_loss(name, correction, case)
    junk = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e4, -1e4, 0.0])
    off = case["mask"] == 0
    scrambled = dict(case)
    for key in ("logp", "old", "behaviour", "ref", "entropy", "values", "old_values"):
        fill = junk[torch.randint(0, len(junk), case[key].shape,
                                  generator=torch.Generator().manual_seed(seed))]
        scrambled[key] = torch.where(off, fill, case[key])
    loss2, grad2 = run_loss(name, correction, scrambled)
    assert torch.isfinite(loss) and torch.allclose(loss, loss2, rtol=1e-5, atol=1e-6)
    assert torch.allclose(grad, grad2, rtol=1e-5, atol=1e-7)
    assert (grad[off] == 0).all()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name,correction", COMBOS)
def test_padding_does_not_matter(name, correction, seed):
    case = random_case(seed)
    loss, grad = run_loss(name, correction, case)
    padded = {k: (torch.cat([v, torch.full((v.shape[0], 3), -0.5)], dim=1) if v.dim() == 2
                  else v) for k, v in case.items()}
    padded["mask"][:, -3:] = 0.0
    loss2, grad2 = run_loss(name, correction, padded)
    assert torch.allclose(loss, loss2, rtol=1e-5, atol=1e-6)
    assert torch.allclose(grad, grad2[:, :-3], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name,correction", COMBOS)
def test_group_order_does_not_matter(name, correction, seed):
    case = random_case(seed)
    loss, grad = run_loss(name, correction, case)
    order = torch.randperm(3, generator=torch.Generator().manual_seed(seed + 100))
    rows = torch.cat([(case["group_ids"] == gid).nonzero().flatten() for gid in order])
    shuffled = {k: v[rows] for k, v in case.items()}
    shuffled["group_ids"] = torch.arange(3).repeat_interleave(3)  # labels follow position
    loss2, grad2 = run_loss(name, correction, shuffled)
    assert torch.allclose(loss, loss2, rtol=1e-5, atol=1e-6)
    assert torch.allclose(grad[rows], grad2, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name,correction",
                         [c for c in COMBOS if not LOSSES[c[0]].uses_value_model])
def test_a_group_whose_rewards_agree_gets_no_gradient(name, correction, seed):
    case = random_case(seed)
    case["logp"] = case["old"].clone()  # the first update: no clip binds, every token counts
    case["rewards"][case["group_ids"] == 1] = 2.0
    case["rewards"][0], case["rewards"][1] = 0.0, 1.0  # keep some signal elsewhere
    _, grad = run_loss(name, correction, case, kl_coef=0.0, entropy_coef=0.0)
    assert grad[case["group_ids"] == 1].abs().max() < 1e-6
    assert grad[case["group_ids"] == 0].abs().max() > 1e-4


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", [n for n, p in LOSSES.items() if p.ratio_level == "token"])
def test_the_clip_stops_the_gradient_exactly_where_it_binds(name, seed):
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 5
    mask = torch.ones(b, t)
    old = -1.0 - torch.rand(b, t, generator=g)
    logp = (old + 0.6 * torch.randn(b, t, generator=g)).requires_grad_(True)
    adv = torch.randn(b, t, generator=g)  # per token, so both signs meet every ratio
    s = loss_config(name, correction="none")
    inp = LossInputs(logp, old, old, adv, mask, values=torch.zeros(b, t),
                     old_values=torch.zeros(b, t), returns=torch.zeros(b, t))
    loss, _ = LOSSES[name](inp, s, t)
    loss.backward()
    low, high = LOSSES[name].clip_range(s)
    ratio = torch.exp(logp.detach() - old)
    binds = ((adv > 0) & (ratio > high)) | ((adv < 0) & (ratio < low))
    assert binds.any() and (~binds).any()
    assert (logp.grad[binds] == 0).all()
    assert (logp.grad[~binds] != 0).all()


@pytest.mark.parametrize("seed", SEEDS)
def test_gspo_ratio_is_the_token_ratio_when_all_tokens_share_one(seed):
    case = random_case(seed)
    shared = 0.3 * torch.randn(case["mask"].shape[0], 1,
                               generator=torch.Generator().manual_seed(seed))
    log_ratio = torch.where(case["mask"] > 0, shared.expand_as(case["mask"]), 0.0)
    on = case["mask"] > 0
    seq = ratio_at_level(log_ratio, case["mask"], "sequence")
    token = ratio_at_level(log_ratio, case["mask"], "token")
    assert torch.allclose(seq[on], token[on], rtol=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_gspo_gradient_is_that_of_the_sequence_objective(seed):
    """The token-form implementation against GSPO's definition written out directly:
    s_i = exp(mean_t log(pi/pi_old)), loss = mean_i max(-A_i s_i, -A_i clip(s_i))."""
    case = random_case(seed)
    mask, old = case["mask"], case["old"]
    adv = torch.randn(mask.shape[0], generator=torch.Generator().manual_seed(seed))
    s = loss_config("gspo", correction="none", clip_eps=0.05)
    logp = case["logp"].clone().requires_grad_(True)
    LOSSES["gspo"](LossInputs(logp, old, old, adv, mask), s)[0].backward()

    direct = case["logp"].clone().requires_grad_(True)
    seq_ratio = torch.exp(((direct - old) * mask).sum(-1) / mask.sum(-1))
    clipped = seq_ratio.clamp(1 - 0.05, 1 + 0.05)
    torch.maximum(-adv * seq_ratio, -adv * clipped).mean().backward()
    assert torch.allclose(logp.grad, direct.grad * mask, atol=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_kl_estimators(seed):
    g = torch.Generator().manual_seed(seed)
    logp = -3 * torch.rand(4, 7, generator=g)
    ref = logp + torch.randn(4, 7, generator=g)
    mask = torch.ones(4, 7)
    assert (kl_per_token(logp, ref, mask, "k3") >= 0).all()
    assert (kl_per_token(logp, ref, mask, "k2") >= 0).all()
    for est in KL_ESTIMATORS:
        assert (kl_per_token(logp, logp.clone(), mask, est) == 0).all()
    # their means estimate the same KL; on tokens drawn from pi, E[k1] = E[k3]: here
    # checked exactly on a two-outcome distribution, weighting each outcome by pi
    pi = torch.tensor([0.7, 0.3])
    q = torch.tensor([0.4, 0.6])
    exact = (pi * (pi / q).log()).sum()
    lp, lq = pi.log()[None], q.log()[None]
    w = torch.ones(1, 2)
    for est in ("k1", "k3"):
        assert (pi * kl_per_token(lp, lq, w, est)[0]).sum() == pytest.approx(exact.item(),
                                                                            abs=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_rloo_baseline_is_the_mean_of_the_others(seed):
    rewards = torch.rand(5, generator=torch.Generator().manual_seed(seed))
    expected = [rewards[i].item() - sum(rewards[j].item() for j in range(5) if j != i) / 4
                for i in range(5)]
    assert leave_one_out_advantages(rewards).tolist() == pytest.approx(expected, abs=1e-6)


def _produced_steps(mask_row):
    return [t for t in range(len(mask_row)) if mask_row[t] > 0]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_gae_with_lambda_one_is_discounted_return_minus_value(seed, gamma):
    case = random_case(seed)
    mask, values = case["mask"], case["values"]
    token_rewards = terminal_rewards(case["rewards"], mask)
    adv, returns = gae(token_rewards, values, mask, gamma=gamma, lam=1.0)
    for i in range(mask.shape[0]):
        steps = _produced_steps(mask[i])
        for k, t in enumerate(steps):
            future = sum(gamma ** j * token_rewards[i, u].item()
                         for j, u in enumerate(steps[k:]))
            assert adv[i, t].item() == pytest.approx(future - values[i, t].item(), abs=1e-5)
            assert returns[i, t].item() == pytest.approx(future, abs=1e-5)
    assert (adv[mask == 0] == 0).all()


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_with_lambda_zero_is_the_td_error(seed):
    case = random_case(seed)
    mask, values = case["mask"], case["values"]
    token_rewards = terminal_rewards(case["rewards"], mask)
    adv, _ = gae(token_rewards, values, mask, gamma=0.8, lam=0.0)
    for i in range(mask.shape[0]):
        steps = _produced_steps(mask[i])
        for k, t in enumerate(steps):
            next_value = values[i, steps[k + 1]].item() if k + 1 < len(steps) else 0.0
            td = token_rewards[i, t].item() + 0.8 * next_value - values[i, t].item()
            assert adv[i, t].item() == pytest.approx(td, abs=1e-5)


def test_every_loss_gives_a_finite_loss_with_every_correction():
    case = random_case(0)
    for name, correction in COMBOS:
        loss, grad = run_loss(name, correction, case)
        assert math.isfinite(loss.item()) and torch.isfinite(grad).all(), (name, correction)
