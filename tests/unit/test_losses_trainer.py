"""Every loss end to end on a tiny model, through the same update the trainer runs
(trainer_svc.objective.Objective.update): one optimizer step, nothing NaN, weights moved,
no gradient left held once the step is taken."""

import copy

import pytest
import torch

from relayrl.config import TrainerConfig
from relayrl.contracts.messages import Group, Sample
from trainer_svc.batching import collate
from trainer_svc.losses import LOSSES
from trainer_svc.objective import Objective

MAX_NEW_TOKENS = 3


def tiny_batch(lm):
    """Two prompts of three samples, varied rewards and lengths, one tool token."""
    groups = []
    for pid, (a, b) in enumerate([(1, 2), (3, 4)]):
        prompt = lm.encode_prompt(f"{a}+{b}=")
        digits = lm.tokenizer.encode(f"{a + b}{a}{b}", add_special_tokens=False)
        samples = []
        for k in range(3):
            response = [*digits[:k + 1], lm.eos_id][:MAX_NEW_TOKENS]
            mask = [1] * len(response)
            if k == 2:
                mask[1] = 0  # a token the model did not produce
            samples.append(Sample(
                prompt_id=pid, lease_id="l", worker_id="w", prompt_tokens=prompt,
                response_tokens=response, logprobs=[-1.0 - 0.2 * j for j in range(len(response))],
                versions=[0] * len(response), reward=float(k == pid), loss_mask=mask))
        groups.append(Group(pid, samples))
    return collate(groups, version=0, pad_id=lm.pad_id, scale_rewards=True)


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_every_loss_takes_a_finite_step_that_moves_the_weights(tiny_lm, loss):
    torch.manual_seed(0)
    model = copy.deepcopy(tiny_lm.model)
    tc = TrainerConfig(loss={"name": loss, "kl_coef": 0.05, "entropy_coef": 0.01,
                             "overlong_buffer": 1}, optimizer={"lr": 1e-2})
    objective = Objective(tc, model, MAX_NEW_TOKENS, temperature=1.0)
    optimizer = torch.optim.AdamW([*model.parameters(), *objective.parameters()],
                                  lr=tc.optimizer.lr)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    heads_before = [p.clone() for p in objective.parameters()]
    calls = []

    model.train()
    result = objective.update(model, optimizer, tiny_batch(tiny_lm),
                              before_first_step=lambda: calls.append(1))

    assert calls == [1]
    for key in ("loss", "grad_norm", "policy_loss", "kl_ref", "entropy", "reward_shaped_mean"):
        assert torch.isfinite(torch.tensor(result.stats[key])), key
    assert result.stats["grad_norm"] > 0
    after = model.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in [*model.parameters(), *objective.parameters()])
    if LOSSES[loss].uses_value_model:
        assert "value_loss" in result.stats
        assert any(not torch.equal(a, b) for a, b in zip(heads_before, objective.parameters(),
                                                          strict=True))


def test_the_reference_stays_frozen_at_the_initial_weights(tiny_lm):
    model = copy.deepcopy(tiny_lm.model)
    tc = TrainerConfig(loss={"kl_coef": 0.1}, optimizer={"lr": 1e-2})
    objective = Objective(tc, model, MAX_NEW_TOKENS, temperature=1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.optimizer.lr)
    batch = tiny_batch(tiny_lm)
    first = objective.update(model, optimizer, batch)
    second = objective.update(model, optimizer, batch)
    for name, p in objective.reference.named_parameters():
        assert not p.requires_grad
        assert torch.equal(p, dict(tiny_lm.model.named_parameters())[name])
    assert first.stats["kl_ref"] == 0.0  # measured before the first step: pi is the reference
    assert second.stats["kl_ref"] > 1e-6


def test_no_reference_copy_without_a_kl_coefficient(tiny_lm):
    objective = Objective(TrainerConfig(), tiny_lm.model, MAX_NEW_TOKENS, temperature=1.0)
    assert objective.reference is None and objective.value_head is None


def test_an_overlong_buffer_past_the_length_cap_is_refused(tiny_lm):
    with pytest.raises(ValueError, match="trainer.loss.overlong_buffer"):
        Objective(TrainerConfig(loss={"overlong_buffer": MAX_NEW_TOKENS + 1}), tiny_lm.model,
                  MAX_NEW_TOKENS, temperature=1.0)
