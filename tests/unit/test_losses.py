"""GRPO advantages, the clipped loss and truncated importance sampling, checked against
numbers worked out by hand."""

import math

import pytest
import torch

from trainer_svc.losses import LossInputs, get_loss, group_advantages, grpo_loss


def test_group_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # mean 0.5; sample std = sqrt(4 * 0.25 / 3) = 0.57735
    adv = group_advantages(rewards, scale=True)
    assert adv.tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)
    assert group_advantages(rewards, scale=False).tolist() == [0.5, -0.5, -0.5, 0.5]


def test_equal_rewards_give_zero_advantage():
    assert group_advantages(torch.tensor([1.0, 1.0, 1.0]), scale=True).tolist() == [0, 0, 0]


def _inputs(old, behaviour, adv, mask, delta=None):
    old = torch.tensor(old)
    logp = (old + (torch.tensor(delta) if delta is not None else 0.0)).requires_grad_(True)
    return logp, LossInputs(logp, old, torch.tensor(behaviour), torch.tensor(adv),
                            torch.tensor(mask))


def test_grpo_loss_with_truncated_importance_sampling():
    # seq 0: IS weights [1, 1.5]; seq 1: raw weights [3, 1], first truncated to the cap 2,
    # second token masked out. Advantages [1, -2]. Ratio is 1 (one step per batch).
    old = [[-1.0, -2.0], [-0.5, -0.7]]
    behaviour = [[-1.0, -2.0 - math.log(1.5)], [-0.5 - math.log(3.0), -0.7]]
    logp, inp = _inputs(old, behaviour, [1.0, -2.0], [[1.0, 1.0], [1.0, 0.0]])
    loss, stats = grpo_loss(inp, clip_eps=0.2, tis_cap=2.0)
    # per token -A * w: seq0 [-1, -1.5] -> mean -1.25; seq1 [4] -> 4; mean over seqs 1.375
    assert loss.item() == pytest.approx(1.375, abs=1e-5)
    loss.backward()
    # d/dlogp = -A * w / (n_tokens(seq) * n_seqs)
    assert logp.grad.flatten().tolist() == pytest.approx([-0.25, -0.375, 2.0, 0.0], abs=1e-5)
    assert stats["is_truncated_frac"] == pytest.approx(1 / 3, abs=1e-6)
    assert stats["is_weight_max"] == pytest.approx(3.0, abs=1e-5)


@pytest.mark.parametrize("adv,expected_grad", [(1.0, 0.0), (-1.0, 1.5)])
def test_clipping_stops_the_gradient_only_in_the_helpful_direction(adv, expected_grad):
    # ratio 1.5 > 1 + eps: with A > 0 the clipped term wins (no gradient); with A < 0 the
    # unclipped, larger-loss term wins and its gradient is -A * ratio = 1.5.
    logp, inp = _inputs([[-1.0]], [[-1.0]], [adv], [[1.0]], delta=[[math.log(1.5)]])
    loss, stats = grpo_loss(inp, clip_eps=0.2, tis_cap=2.0)
    loss.backward()
    assert logp.grad.item() == pytest.approx(expected_grad, abs=1e-5)
    assert stats["clip_frac"] == 1.0


def test_masked_tokens_do_not_matter():
    base = dict(old=[[-1.0, -1.0]], behaviour=[[-1.0, -1.0]], adv=[1.0], mask=[[1.0, 0.0]])
    _, a = _inputs(**base)
    _, b = _inputs(old=[[-1.0, -9.0]], behaviour=[[-1.0, -0.1]], adv=[1.0], mask=[[1.0, 0.0]])
    assert grpo_loss(a, 0.2, 2.0)[0].item() == grpo_loss(b, 0.2, 2.0)[0].item()


def test_unknown_loss_is_named():
    with pytest.raises(ValueError, match="trainer.loss"):
        get_loss("nope")


def test_tool_tokens_are_left_out_of_the_loss_mask():
    from relayrl.contracts.messages import Group, Sample
    from trainer_svc.batching import collate

    s = Sample(prompt_id=1, lease_id="ext", worker_id="agent", prompt_tokens=[1, 4],
               response_tokens=[6, 7, 8, 9], logprobs=[-0.1, 0.0, 0.0, -0.2],
               versions=[3, 3, 3, 3], reward=1.0, loss_mask=[1, 0, 0, 1])
    tb = collate([Group(1, [s])], version=3, pad_id=0, scale_rewards=False)
    # logits at t predict token t+1: response tokens sit at 2..5, predicted from 1..4
    assert tb.response_mask[0].tolist() == [0.0, 1.0, 0.0, 0.0, 1.0]
    assert tb.behaviour_logprobs[0].tolist() == pytest.approx([0.0, -0.1, 0.0, 0.0, -0.2])
