"""Every registry loss, advantage estimator, correction and regulariser, checked against
numbers worked out by hand (the arithmetic is in the comments)."""

import math

import pytest
import torch

from relayrl.config import ConfigError, TrainerConfig, load_run_config
from relayrl.config.loss import RECIPES, loss_config
from relayrl.contracts.messages import Group, Sample
from trainer_svc.batching import collate, split_uniform
from trainer_svc.losses import LOSSES, LossInputs
from trainer_svc.losses.advantages import (
    leave_one_out_advantages,
    overlong_penalty,
    sequence_advantages,
)
from trainer_svc.losses.corrections import correct
from trainer_svc.losses.policy import ratio_at_level, sequence_log_ratio
from trainer_svc.losses.ppo import clipped_value_loss, gae, terminal_rewards
from trainer_svc.losses.regularizers import entropy_from_logprobs, kl_per_token

GROUPS = torch.tensor([0, 0, 1, 1, 1])


@pytest.fixture
def empty(tmp_path):
    """A config file that sets nothing, for overrides."""
    path = tmp_path / "c.yaml"
    path.write_text("{}\n")
    return path


def test_every_loss_name_is_in_the_registry_and_the_config():
    assert set(RECIPES) == set(LOSSES)
    assert set(LOSSES) == {"grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "gspo", "ppo"}


def test_grpo_advantages_per_group():
    rewards = torch.tensor([1.0, 0.0, 2.0, 2.0, 5.0])
    # group 0: mean 0.5 -> [0.5, -0.5]; sample std sqrt(0.5 / 1) = 0.70711 -> +-0.70711
    # group 1: mean 3 -> [-1, -1, 2]; sample std sqrt(6 / 2) = 1.73205 -> [-0.57735, .., 1.1547]
    assert sequence_advantages("grpo", rewards, GROUPS, True).tolist() == pytest.approx(
        [0.70711, -0.70711, -0.57735, -0.57735, 1.15470], abs=1e-4)
    assert sequence_advantages("grpo", rewards, GROUPS, False).tolist() == pytest.approx(
        [0.5, -0.5, -1.0, -1.0, 2.0])
    # Dr. GRPO never scales, whatever scale_rewards says
    assert sequence_advantages("dr_grpo", rewards, GROUPS, True).tolist() == pytest.approx(
        [0.5, -0.5, -1.0, -1.0, 2.0])


def test_rloo_baseline_is_the_mean_of_the_others():
    # 3 - (1 + 2) / 2 = 1.5;  1 - (3 + 2) / 2 = -1.5;  2 - (3 + 1) / 2 = 0
    assert leave_one_out_advantages(torch.tensor([3.0, 1.0, 2.0])).tolist() == [1.5, -1.5, 0.0]
    assert leave_one_out_advantages(torch.tensor([5.0])).tolist() == [0.0]  # no one to compare


def test_reinforce_pp_normalises_over_the_batch():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 2.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    # group-centred: [0.5, -0.5, 0, 0, -1, 1], batch mean 0,
    # population variance (0.25 + 0.25 + 1 + 1) / 6 = 0.416667, std 0.645497
    assert sequence_advantages("reinforce_pp", rewards, groups, True).tolist() == pytest.approx(
        [0.774597, -0.774597, 0.0, 0.0, -1.549193, 1.549193], abs=1e-5)


def test_overlong_penalty_ramps_over_the_buffer():
    lengths = torch.tensor([5, 6, 7, 8, 10, 12])
    # max 10, buffer 4: free up to 6 tokens, then -1/4 per token, -1 from 10 on
    assert overlong_penalty(lengths, 10, 4, 1.0).tolist() == [0, 0, -0.25, -0.5, -1.0, -1.0]
    assert overlong_penalty(lengths, 10, 4, 0.5).tolist() == [0, 0, -0.125, -0.25, -0.5, -0.5]
    assert overlong_penalty(lengths, 10, 0, 1.0).tolist() == [0] * 6
    with pytest.raises(ValueError, match="trainer.loss.overlong_buffer"):
        overlong_penalty(lengths, 10, 11, 1.0)


def _loss_of(name, delta, adv, mask, settings=None, old=None, behaviour=None):
    """Run a registry loss on logp = old + delta; returns (loss, stats, grad wrt logp)."""
    delta = torch.tensor(delta)
    old = torch.full_like(delta, -1.0) if old is None else torch.tensor(old)
    logp = (old + delta).requires_grad_(True)
    behaviour = old.clone() if behaviour is None else torch.tensor(behaviour)
    inp = LossInputs(logp, old, behaviour, torch.tensor(adv), torch.tensor(mask))
    loss, stats = LOSSES[name](inp, settings or loss_config(name, correction="none"), 4)
    loss.backward()
    return loss.item(), stats, logp.grad.flatten().tolist()


@pytest.mark.parametrize("name,loss,grad", [
    # per-token -A at ratio 1: seq0 [-1, -1], seq1 [3] (second token masked)
    # grpo: token means [-1, 3], mean 1;        dlogp = -A / (n_tokens(seq) * 2 seqs)
    ("grpo", 1.0, [-0.25, -0.25, 1.5, 0.0]),
    # dr_grpo: token sums / max_len 4 = [-0.5, 0.75], mean 0.125;  dlogp = -A / (4 * 2)
    ("dr_grpo", 0.125, [-0.125, -0.125, 0.375, 0.0]),
    # dapo: (-1 - 1 + 3) / 3 tokens = 0.33333;  dlogp = -A / 3
    ("dapo", 1 / 3, [-1 / 3, -1 / 3, 1.0, 0.0]),
])
def test_aggregations(name, loss, grad):
    got_loss, _, got_grad = _loss_of(name, [[0.0, 0.0], [0.0, 0.0]], [1.0, -3.0],
                                     [[1.0, 1.0], [1.0, 0.0]])
    assert got_loss == pytest.approx(loss, abs=1e-6)
    assert got_grad == pytest.approx(grad, abs=1e-6)


@pytest.mark.parametrize("name,ratio,adv,grad", [
    ("grpo", 1.25, 1.0, 0.0),  # 1.25 > 1 + 0.2 and A > 0: clipped, no gradient
    ("dapo", 1.25, 1.0, -1.25),  # 1.25 < 1 + 0.28: inside, dlogp = -A * r
    ("dapo", 0.75, -1.0, 0.0),  # 0.75 < 1 - 0.2 and A < 0: clipped below
    ("dapo", 0.75, 1.0, -0.75),  # A > 0 at a low ratio: the unclipped term is the larger
])
def test_dapo_clips_higher_above_than_below(name, ratio, adv, grad):
    _, _, got = _loss_of(name, [[math.log(ratio)]], [adv], [[1.0]])
    assert got == pytest.approx([grad], abs=1e-6)


def test_gspo_ratio_and_clip_are_per_sequence():
    # token ratios 1.1 and 0.9: s = exp((log 1.1 + log 0.9) / 2) = sqrt(0.99) = 0.994987
    delta = [[math.log(1.1), math.log(0.9)]]
    wide = loss_config("gspo", correction="none", clip_eps=0.2)
    loss, _, grad = _loss_of("gspo", delta, [1.0], [[1.0, 1.0]], wide)
    # loss -A s; d(-A s)/dlogp_t = -A s / 2 = -0.497494 for both tokens
    assert loss == pytest.approx(-0.994987, abs=1e-6)
    assert grad == pytest.approx([-0.497494, -0.497494], abs=1e-6)
    # default clip 4e-4: s < 1 - 4e-4 clips the whole sequence for A < 0, the 1.1 token too
    loss, stats, grad = _loss_of("gspo", delta, [-1.0], [[1.0, 1.0]],
                                 loss_config("gspo", correction="none"))
    assert loss == pytest.approx(1 - 4e-4, abs=1e-6)
    assert grad == [0.0, 0.0] and stats["clip_frac"] == 1.0


def test_sequence_ratio_is_the_mean_token_log_ratio():
    log_ratio = torch.tensor([[0.2, -0.4, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert sequence_log_ratio(log_ratio, mask).tolist() == pytest.approx([-0.1])
    ratio = ratio_at_level(log_ratio, mask, "sequence")
    assert ratio[0, :2].tolist() == pytest.approx([math.exp(-0.1)] * 2)


# Corrections: ratio pi/pi_old = 1, A = 1 on every sequence, cap 2, grpo aggregation.

def _correction(name, behaviour_gap, mask=((1.0, 1.0),), old=None):
    """behaviour_gap: pi_old/mu per token, so mu = pi_old - log(gap)."""
    old_t = [[-1.0] * len(mask[0]) for _ in mask] if old is None else old
    behaviour = [[o - math.log(g) for o, g in zip(orow, grow, strict=True)]
                 for orow, grow in zip(old_t, behaviour_gap, strict=True)]
    return _loss_of("grpo", [[0.0] * len(mask[0]) for _ in mask], [1.0] * len(mask),
                    [list(m) for m in mask], loss_config(correction=name, tis_cap=2.0),
                    old=old_t, behaviour=behaviour)


def test_tis_token_caps_each_token():
    # weights [1.5, min(3, 2)] -> token terms [-1.5, -2], mean -1.75
    loss, stats, grad = _correction("tis_token", [[1.5, 3.0]])
    assert loss == pytest.approx(-1.75, abs=1e-6)
    assert grad == pytest.approx([-0.75, -1.0], abs=1e-6)
    assert stats["is_truncated_frac"] == 0.5


def test_decoupled_drops_tokens_over_the_cap():
    # weights [1.5, 3 > cap -> 0] -> token terms [-1.5, 0], mean -0.75
    loss, stats, grad = _correction("decoupled", [[1.5, 3.0]])
    assert loss == pytest.approx(-0.75, abs=1e-6)
    assert grad == pytest.approx([-0.75, 0.0], abs=1e-6)
    assert stats["is_truncated_frac"] == 0.5


def test_tis_seq_caps_the_product_per_sequence():
    # seq 0: 1.5 * 2 = 3 -> capped to 2, both tokens -2, mean -2
    # seq 1: 0.5 (second token masked, its gap ignored) -> -0.5; loss (-2 - 0.5) / 2 = -1.25
    loss, stats, grad = _correction("tis_seq", [[1.5, 2.0], [0.5, 1e6]],
                                    mask=((1.0, 1.0), (1.0, 0.0)))
    assert loss == pytest.approx(-1.25, abs=1e-6)
    assert grad == pytest.approx([-0.5, -0.5, -0.25, 0.0], abs=1e-6)
    assert stats["is_weight_mean"] == pytest.approx(1.75, abs=1e-5)  # (3 + 0.5) / 2
    assert stats["is_truncated_frac"] == 0.5


def test_none_ignores_the_behaviour_policy():
    loss, _, grad = _correction("none", [[1.5, 3.0]])
    assert loss == pytest.approx(-1.0) and grad == pytest.approx([-0.5, -0.5])


@pytest.mark.parametrize("adv,grad", [(1.0, [-0.75, -1.0]), (-1.0, [0.75, 1.0])])
def test_aipo_truncates_pi_over_mu_one_sidedly(adv, grad):
    # pi/mu = [1.5, 3]; pi_old is garbage and must not matter. LlamaRL's update is
    # min(r, 2) A grad log pi (the weight carries no gradient), so the term's value is
    # -A min(r, 2) and dlogp = -A min(r, 2) / 2 tokens: -A 1.5 / 2 below the cap, and
    # -A 2 / 2 above it, whatever the sign of A (not 0: the token still pulls, at the cap)
    logp = [[-1.0, -1.0]]
    behaviour = [[-1.0 - math.log(1.5), -1.0 - math.log(3.0)]]
    old = [[-7.0, -0.01]]
    loss, stats, got = _loss_of("grpo", [[logp[0][0] - old[0][0], logp[0][1] - old[0][1]]],
                                [adv], [[1.0, 1.0]], loss_config(correction="aipo"),
                                old=old, behaviour=behaviour)
    assert loss == pytest.approx(-adv * (1.5 + 2.0) / 2, abs=1e-5)
    assert got == pytest.approx(grad, abs=1e-5)
    assert stats["clip_frac"] == 0.5


def test_unknown_correction_is_named(empty):
    with pytest.raises(ValueError, match="trainer.loss.correction"):
        correct("bogus", *[torch.zeros(1, 1)] * 4, cap=2.0)
    with pytest.raises(ConfigError, match=r"trainer\.loss\.correction \(grpo\)"):
        load_run_config(empty, ["trainer.loss.correction=bogus"])


# Regularisers

def test_kl_estimators_hand_computed():
    # ref/pi = 0.5, x = log 0.5 = -0.693147
    logp, ref, mask = torch.tensor([[-1.0]]), torch.tensor([[-1.0 + math.log(0.5)]]), \
        torch.ones(1, 1)
    assert kl_per_token(logp, ref, mask, "k1").item() == pytest.approx(0.693147, abs=1e-6)
    # x^2 / 2 = 0.480453 / 2
    assert kl_per_token(logp, ref, mask, "k2").item() == pytest.approx(0.240227, abs=1e-6)
    # (0.5 - 1) - log 0.5 = 0.193147
    assert kl_per_token(logp, ref, mask, "k3").item() == pytest.approx(0.193147, abs=1e-6)
    with pytest.raises(ValueError, match="trainer.loss.kl_estimator"):
        kl_per_token(logp, ref, mask, "k4")


def test_kl_and_entropy_enter_the_loss_with_their_coefficients():
    old = torch.tensor([[-1.0, -2.0]])
    ref = old + math.log(0.5)  # k3 = 0.193147 on each token
    entropy = torch.tensor([[1.0, 3.0]])
    mask = torch.ones(1, 2)
    base = loss_config(correction="none")
    with_reg = loss_config(correction="none", kl_coef=0.1, entropy_coef=0.01)
    inp = LossInputs(old.clone(), old, old, torch.tensor([1.0]), mask, entropy=entropy,
                     ref_logprobs=ref)
    plain, stats = LOSSES["grpo"](inp, base)
    regularised, _ = LOSSES["grpo"](inp, with_reg)
    # + 0.1 * 0.193147 - 0.01 * mean(1, 3) = 0.0193147 - 0.02
    assert (regularised - plain).item() == pytest.approx(0.0193147 - 0.02, abs=1e-6)
    assert stats["kl_ref"] == pytest.approx(0.193147, abs=1e-6)
    assert stats["entropy"] == pytest.approx(2.0)


def test_entropy_of_a_uniform_and_a_certain_distribution():
    logp = torch.log_softmax(torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, -1e4, -1e4, -1e4]]), -1)
    assert entropy_from_logprobs(logp).tolist() == pytest.approx([math.log(4), 0.0], abs=1e-6)


# PPO pieces

def test_terminal_rewards_sit_on_the_last_produced_token():
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    out = terminal_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert out.tolist() == [[0, 0, 2, 0], [0, 0, 0, 3], [0, 0, 0, 0]]


def test_gae_hand_computed():
    # one sequence, terminal reward 1, values [0.5, 0.2, 0.4], gamma 1, lambda 0.5
    # t2: delta = 1 - 0.4 = 0.6, A = 0.6;  t1: delta = 0.4 - 0.2 = 0.2, A = 0.2 + 0.5 * 0.6 = 0.5
    # t0: delta = 0.2 - 0.5 = -0.3, A = -0.3 + 0.5 * 0.5 = -0.05;  returns = A + V
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.2, 0.4]])
    adv, ret = gae(rewards, values, torch.ones(1, 3), gamma=1.0, lam=0.5)
    assert adv[0].tolist() == pytest.approx([-0.05, 0.5, 0.6], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([0.45, 0.7, 1.0], abs=1e-6)
    # a token the model did not produce (tool output) is no step: GAE passes over it
    # t2: A = 0.6;  t0: delta = 0.4 - 0.5 = -0.1, A = -0.1 + 0.5 * 0.6 = 0.2
    values = torch.tensor([[0.5, 9.0, 0.4]])
    adv, _ = gae(rewards, values, torch.tensor([[1.0, 0.0, 1.0]]), gamma=1.0, lam=0.5)
    assert adv[0].tolist() == pytest.approx([0.2, 0.0, 0.6], abs=1e-6)
    # gamma 0.5, lambda 1: A_t = gamma^(2 - t) * 1 - V_t = [0.25 - 0.5, 0.5 - 0.2, 1 - 0.4]
    adv, _ = gae(rewards, torch.tensor([[0.5, 0.2, 0.4]]), torch.ones(1, 3), gamma=0.5, lam=1.0)
    assert adv[0].tolist() == pytest.approx([-0.25, 0.3, 0.6], abs=1e-6)


def test_clipped_value_loss_hand_computed():
    # V 1.0 moved 0.5 from old 0.5, clip 0.2 -> V_clip 0.7; R 2:
    # plain (1 - 2)^2 = 1 < clipped (0.7 - 2)^2 = 1.69 -> 0.845, and no gradient to V
    values = torch.tensor([[1.0, 0.6]], requires_grad=True)
    loss, clipped = clipped_value_loss(values, torch.tensor([[0.5, 0.5]]),
                                       torch.tensor([[2.0, 2.0]]), clip=0.2)
    # second: V 0.6 within the clip: 0.5 * (0.6 - 2)^2 = 0.98, dloss/dV = V - R = -1.4
    assert loss[0].tolist() == pytest.approx([0.845, 0.98], abs=1e-6)
    assert clipped.tolist() == [[True, False]]
    loss.sum().backward()
    assert values.grad[0].tolist() == pytest.approx([0.0, -1.4], abs=1e-6)


def test_ppo_adds_the_weighted_value_loss():
    old = torch.tensor([[-1.0, -1.0]])
    mask = torch.ones(1, 2)
    values = torch.tensor([[0.6, 0.6]], requires_grad=True)
    inp = LossInputs(old.clone(), old, old, torch.tensor([[1.0, -1.0]]), mask,
                     values=values, old_values=torch.tensor([[0.5, 0.5]]),
                     returns=torch.tensor([[2.0, 1.0]]))
    loss, stats = LOSSES["ppo"](inp, loss_config("ppo", correction="none", value_coef=0.5))
    # policy: token mean of -A = (-1 + 1) / 2 = 0
    # value: 0.5 * [(0.6 - 2)^2, (0.6 - 1)^2] = [0.98, 0.08], mean 0.53; total 0.5 * 0.53
    assert stats["value_loss"] == pytest.approx(0.53, abs=1e-6)
    assert loss.item() == pytest.approx(0.265, abs=1e-6)
    with pytest.raises(ValueError, match="needs values"):
        LOSSES["ppo"](LossInputs(old, old, old, torch.tensor([1.0]), mask), loss_config("ppo"))


def test_uniform_groups_are_split_off():
    def group(pid, rewards):
        return Group(pid, [Sample(prompt_id=pid, lease_id="l", worker_id="w", prompt_tokens=[1],
                                  response_tokens=[2], logprobs=[-1.0], versions=[0], reward=r)
                           for r in rewards])

    varied, uniform = split_uniform([group(1, [1.0, 0.0]), group(2, [1.0, 1.0]),
                                     group(3, [0.0, 0.0]), group(4, [0.5])])
    assert [g.prompt_id for g in varied] == [1]
    assert [g.prompt_id for g in uniform] == [2, 3, 4]


def test_collate_records_each_samples_group():
    def sample(pid):
        return Sample(prompt_id=pid, lease_id="l", worker_id="w", prompt_tokens=[1],
                      response_tokens=[2], logprobs=[-1.0], versions=[0], reward=0.0)

    tb = collate([Group(7, [sample(7)] * 2), Group(3, [sample(3)] * 3)], 0, 0, True)
    assert tb.group_ids.tolist() == [0, 0, 1, 1, 1]


# Config: trainer.loss is a union of recipe models, picked by name

# every recipe's fields and defaults, as they were when the trainer held them flat
COMMON = {"correction": "tis_token", "tis_cap": 2.0, "kl_coef": 0.0, "kl_estimator": "k3",
          "entropy_coef": 0.0, "overlong_buffer": 0, "overlong_penalty": 1.0}
DEFAULTS = {
    "grpo": {"clip_eps": 0.2, "scale_rewards": True},
    "dr_grpo": {"clip_eps": 0.2},
    "dapo": {"clip_eps_low": 0.2, "clip_eps_high": 0.28, "scale_rewards": True},
    "rloo": {"clip_eps": 0.2},
    "reinforce_pp": {"clip_eps": 0.2},
    "gspo": {"clip_eps": 4e-4, "scale_rewards": True},
    "ppo": {"clip_eps": 0.2, "gamma": 1.0, "gae_lambda": 0.95, "value_coef": 0.5,
            "value_clip": 0.2},
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_has_only_its_fields_with_the_old_defaults(name):
    cfg = TrainerConfig(loss=name).loss
    assert cfg.model_dump() == {"name": name, **COMMON, **DEFAULTS[name]}
    for field, info in type(cfg).model_fields.items():
        assert field == "name" or info.description, (name, field)


def test_the_default_loss_is_grpo_and_a_mapping_without_a_name_is_grpo():
    assert TrainerConfig().loss == loss_config("grpo")
    assert TrainerConfig(loss={"clip_eps": 0.3}).loss == loss_config("grpo", clip_eps=0.3)


def test_an_unknown_loss_name_lists_the_known_ones(empty):
    with pytest.raises(ConfigError) as err:
        load_run_config(empty, ["trainer.loss.name=trpo"])
    assert "trainer.loss: Input tag 'trpo'" in str(err.value)
    for name in RECIPES:
        assert f"'{name}'" in str(err.value)


@pytest.mark.parametrize("overrides,message", [
    (["trainer.loss.clip_eps_low=0.1"],
     "trainer.loss.clip_eps_low (grpo): 'clip_eps_low' is not a field of loss 'grpo' "
     "(a field of dapo)"),
    (["trainer.loss.name=dapo", "trainer.loss.clip_eps=0.1"],
     "'clip_eps' is not a field of loss 'dapo' (a field of grpo, dr_grpo, rloo"),
    (["trainer.loss.name=rloo", "trainer.loss.scale_rewards=false"],
     "'scale_rewards' is not a field of loss 'rloo' (a field of grpo, dapo, gspo)"),
    (["trainer.loss.name=grpo", "trainer.loss.gamma=0.9"],
     "'gamma' is not a field of loss 'grpo' (a field of ppo)"),
    (["trainer.loss.bogus=1"], "'bogus' is not a field of loss 'grpo' (no loss's field)"),
])
def test_a_field_of_another_recipe_is_refused_by_name(overrides, message, empty):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_run_config(empty, overrides)


@pytest.mark.parametrize("key,value,moved", [
    ("clip_eps", 0.3, "set trainer.loss.clip_eps, as in `trainer: {loss: {name: grpo, "
                      "clip_eps: 0.3}}`"),
    ("clip_eps_high", 0.3, "trainer.loss.clip_eps_high, as in `trainer: {loss: {name: dapo"),
    ("gspo_clip_eps", 0.01, "trainer.loss.clip_eps, as in `trainer: {loss: {name: gspo"),
    ("kl_coef", 0.1, "trainer.loss.kl_coef"),
    ("correction", "none", "trainer.loss.correction"),
])
def test_an_old_flat_loss_field_says_where_it_moved(key, value, moved, empty):
    with pytest.raises(ConfigError) as err:
        load_run_config(empty, [f"trainer.{key}={value}"])
    assert f"trainer.{key} moved into the loss recipe" in str(err.value)
    assert moved in str(err.value)


def test_overrides_reach_into_the_recipe(empty):
    cfg = load_run_config(empty, ["trainer.loss.name=dapo", "trainer.loss.clip_eps_high=0.3",
                                     "trainer.loss.kl_coef=0.01"])
    assert cfg.trainer.loss == loss_config("dapo", clip_eps_high=0.3, kl_coef=0.01)
    assert load_run_config(empty, ["trainer.loss=ppo"]).trainer.loss.name == "ppo"


def test_a_recipe_survives_the_launchers_round_trip(empty):
    """`relayrl up` writes the validated config back to YAML for the services."""
    cfg = load_run_config(empty, ["trainer.loss={name: ppo, gamma: 0.9}"])
    again = TrainerConfig.model_validate(cfg.trainer.model_dump(mode="json"))
    assert again.loss == loss_config("ppo", gamma=0.9)


@pytest.mark.parametrize("override,field", [
    ("trainer.loss.correction=vtrace", "trainer.loss.correction (grpo)"),
    ("trainer.loss.kl_estimator=k4", "trainer.loss.kl_estimator (grpo)"),
    ("trainer.loss.kl_coef=-0.1", "trainer.loss.kl_coef (grpo)"),
    ("trainer.loss.entropy_coef=-1", "trainer.loss.entropy_coef (grpo)"),
    ("trainer.loss={name: dapo, clip_eps_low: 1.0}", "trainer.loss.clip_eps_low (dapo)"),
    ("trainer.loss.clip_eps=1.5", "trainer.loss.clip_eps (grpo)"),
    ("trainer.loss={name: ppo, gae_lambda: 1.5}", "trainer.loss.gae_lambda (ppo)"),
    ("trainer.loss={name: ppo, gamma: -0.1}", "trainer.loss.gamma (ppo)"),
    ("trainer.loss.overlong_buffer=-1", "trainer.loss.overlong_buffer (grpo)"),
    ("trainer.updates_per_batch=0", "trainer.updates_per_batch"),
    ("trainer.loss={name: ppo, value_clip: 0}", "trainer.loss.value_clip (ppo)"),
])
def test_bad_loss_settings_name_the_field(override, field, empty):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.").replace("(", r"\(")
                       .replace(")", r"\)")):
        load_run_config(empty, [override])


def test_an_overlong_buffer_past_the_length_cap_is_refused_at_load(empty):
    with pytest.raises(ConfigError, match=r"trainer\.loss\.overlong_buffer \(9\) must be at "
                       r"most rollout\.max_new_tokens \(8\)"):
        load_run_config(empty, ["trainer.loss.overlong_buffer=9"])
