"""The shared-prompt pass (trainer_svc.shared_prefix) against the plain one: the same
log-probabilities, entropies, hidden states and gradients on every response position, and
the same optimizer step for every loss, on prompts of different lengths, a prompt that two
groups share, a response token the model did not produce, and a one-sample group."""

import copy

import pytest
import torch

from relayrl.config import TrainerConfig
from relayrl.contracts.messages import Group, Sample
from trainer_svc.batching import collate, policy_outputs
from trainer_svc.losses import LOSSES
from trainer_svc.objective import Objective
from trainer_svc.shared_prefix import prompt_sharing, shared_prefix_outputs

MAX_NEW_TOKENS = 4
PROBLEMS = [("1+2=", 3), ("13+4=", 2), ("1+2=", 2), ("27+35=", 1)]  # the first two share


def varied_batch(lm):
    groups = []
    for pid, (text, size) in enumerate(PROBLEMS):
        prompt = lm.encode_prompt(text)
        samples = []
        for k in range(size):
            response = lm.tokenizer.encode(str(10 ** k + pid), add_special_tokens=False)
            response = [*response, lm.eos_id][:MAX_NEW_TOKENS]
            mask = [1] * len(response)
            if k == 1:
                mask[0] = 0  # a token the model did not produce
            samples.append(Sample(
                prompt_id=pid, lease_id="l", worker_id="w", prompt_tokens=prompt,
                response_tokens=response, logprobs=[-0.5] * len(response),
                versions=[0] * len(response), reward=float(k % 2), loss_mask=mask))
        groups.append(Group(pid, samples))
    return collate(groups, version=0, pad_id=lm.pad_id, scale_rewards=True)


def test_rows_with_one_prompt_share_an_id(tiny_lm):
    tb = varied_batch(tiny_lm)
    first, inverse = prompt_sharing(tb)
    assert len(first) == 3  # "1+2=" twice among the groups
    assert set(inverse[:3].tolist()) == set(inverse[5:7].tolist()) == {int(inverse[0])}
    assert len(set(inverse[3:5].tolist()) | set(inverse[7:].tolist()) | {int(inverse[0])}) == 3
    assert torch.equal(tb.input_ids[first[inverse], :4], tb.input_ids[:, :4])


def response_positions(tb):
    """[B, L-1] bool: the positions that predict a response token."""
    lengths = tb.attention_mask.sum(dim=1)
    pos = torch.arange(tb.input_ids.shape[1] - 1)
    return (pos >= tb.prompt_lengths[:, None] - 1) & (pos < lengths[:, None] - 1)


def test_outputs_and_gradients_equal_the_plain_pass(tiny_lm):
    tb = varied_batch(tiny_lm)
    where = response_positions(tb)
    results = {}
    for name in ("plain", "shared"):
        model = copy.deepcopy(tiny_lm.model).train()
        if name == "plain":
            out = policy_outputs(model, tb, 0.7, entropy_grad=True, hidden=True)
        else:
            out = shared_prefix_outputs(model, tb, 0.7, prompt_sharing(tb), entropy_grad=True,
                                        hidden=True)
        (out.logprobs[where].sum() + out.entropy[where].sum()
         + out.hidden[where].square().mean()).backward()
        results[name] = out, {n: p.grad for n, p in model.named_parameters()}
    (plain, plain_grads), (shared, shared_grads) = results["plain"], results["shared"]
    assert torch.allclose(shared.logprobs[where], plain.logprobs[where], atol=1e-5)
    assert torch.allclose(shared.entropy[where], plain.entropy[where], atol=1e-5)
    assert torch.allclose(shared.hidden[where], plain.hidden[where], atol=1e-5)
    assert shared.logprobs.shape == plain.logprobs.shape
    for name, grad in plain_grads.items():
        assert torch.allclose(shared_grads[name], grad, atol=1e-5), name


def one_update(tiny_lm, loss, shared, budget):
    torch.manual_seed(0)  # the value head's initial weights
    model = copy.deepcopy(tiny_lm.model)
    tc = TrainerConfig(loss={"name": loss, "kl_coef": 0.05, "entropy_coef": 0.01},
                       optimizer={"lr": 0.5},
                       updates_per_batch=2, shared_prefix=shared,
                       micro_batch_tokens=budget)
    objective = Objective(tc, model, MAX_NEW_TOKENS, temperature=1.0)
    optimizer = torch.optim.SGD([*model.parameters(), *objective.parameters()],
                                lr=tc.optimizer.lr)
    model.train()
    return model, objective.update(model, optimizer, varied_batch(tiny_lm))


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("budget", [0, 1])  # one pass; a pass per row, nothing shared
def test_an_update_equals_the_plain_update(tiny_lm, loss, budget):
    plain_model, plain = one_update(tiny_lm, loss, False, budget)
    model, shared = one_update(tiny_lm, loss, True, budget)
    for key in ("loss", "grad_norm", "policy_loss", "kl_ref", "entropy", "clip_frac"):
        assert shared.stats[key] == pytest.approx(plain.stats[key], rel=1e-4, abs=1e-6), key
    real = varied_batch(tiny_lm).response_mask > 0
    assert torch.allclose(shared.old_logprobs[real], plain.old_logprobs[real], atol=1e-5)
    for (name, a), b in zip(plain_model.state_dict().items(), model.state_dict().values(),
                            strict=True):
        assert torch.allclose(a, b, atol=1e-5), name
