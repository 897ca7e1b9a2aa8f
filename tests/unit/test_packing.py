"""Packed passes (trainer_svc.packing) against padded rows: the same log-probabilities,
entropies, hidden states and gradients on every response position, and the same update for
every loss (token and sequence aggregations), under micro-batch budgets, with a LoRA adapter,
on sequences of mixed lengths (5 to 24 tokens). The layout each attention implementation
gets, and the padded fallback for a model that attends across packed sequences."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from relayrl.config import TrainerConfig
from relayrl.contracts.messages import Group, Sample
from relayrl_torch.models.lora import with_lora
from tests.unit.test_shared_prefix import response_positions
from trainer_svc.batching import collate, policy_outputs
from trainer_svc.losses import LOSSES
from trainer_svc.micro_batches import split_batch
from trainer_svc.objective import Objective
from trainer_svc.packing import Packing, packed_outputs, packs_correctly, plan_packed, varlen

MAX_NEW_TOKENS = 16
# (prompt, samples' response lengths): prompts of 5 to 8 tokens, responses of 0 to 16
PROBLEMS = [("1+2=", [1, 16, 3]), ("13+4=", [9, 2]), ("27+35=", [12, 5, 16, 1]), ("5+5=", [7])]


def mixed_batch(lm):
    groups = []
    for pid, (text, sizes) in enumerate(PROBLEMS):
        prompt = lm.encode_prompt(text)
        samples = []
        for k, size in enumerate(sizes):
            digits = lm.tokenizer.encode(str(7 ** (k + 3) + pid) * 4, add_special_tokens=False)
            response = [*digits[:size - 1], lm.eos_id]
            mask = [1] * len(response)
            if size > 2:
                mask[1] = 0  # a token the model did not produce
            samples.append(Sample(
                prompt_id=pid, lease_id="l", worker_id="w", prompt_tokens=prompt,
                response_tokens=response, logprobs=[-0.5 - 0.1 * j for j in range(size)],
                versions=[0] * size, reward=float((k + pid) % 2), loss_mask=mask))
        groups.append(Group(pid, samples))
    return collate(groups, version=0, pad_id=lm.pad_id, scale_rewards=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=40), st.integers(0, 2048),
       st.booleans())
def test_a_plan_packs_every_sequence_once_within_budget(lengths, budget, one_row):
    plan = plan_packed(lengths, budget, one_row)
    assert sorted(i for rows in plan for row in rows for i in row) == list(range(len(lengths)))
    width = max(lengths)
    for rows in plan:
        if one_row:
            assert len(rows) == 1
            assert len(rows[0]) == 1 or budget == 0 or sum(lengths[i] for i in rows[0]) <= budget
        else:
            assert all(sum(lengths[i] for i in row) <= width for row in rows)
            assert len(rows) == 1 or budget == 0 or len(rows) * width <= budget
    if budget == 0:
        assert len(plan) == 1


def test_position_ids_restart_with_every_sequence_and_pack_round_trips():
    lengths = [3, 1, 4, 2]
    packing = Packing.build(lengths, [[2, 1], [0, 3]], torch.device("cpu"))
    assert packing.rows == 2 and packing.width == 5
    assert packing.position_ids.tolist() == [[0, 1, 2, 3, 0], [0, 1, 2, 0, 1]]
    ids = torch.tensor([[10, 11, 12, 0], [20, 0, 0, 0], [30, 31, 32, 33], [40, 41, 0, 0]])
    assert packing.pack(ids, fill=-1).tolist() == [[30, 31, 32, 33, 20], [10, 11, 12, 40, 41]]
    per_token = torch.arange(32.0).view(4, 4, 2)  # a per-token tensor with its own last axis
    packed = packing.pack(per_token)
    assert torch.equal(packed.view(-1, 2)[packing.at], per_token[packing.row, packing.col])


def test_flash_attention_gets_one_row_and_sdpa_rows_of_the_longest(tiny_lm):
    """The layout follows the attention: a varlen kernel takes packed sequences in one row
    (and costs what they cost alone); a dense block-diagonal mask costs a row's width
    squared, so rows are as wide as the longest sequence."""
    tb = mixed_batch(tiny_lm)
    lengths = tb.attention_mask.sum(dim=1).tolist()
    model = copy.deepcopy(tiny_lm.model)
    assert not varlen(model)
    [part] = split_batch(tb, 0, "token_mean", packed=True, one_row=varlen(model))
    assert part.packing.width == max(lengths) and part.packing.rows < len(lengths)
    model.config._attn_implementation = "flash_attention_2"
    assert varlen(model)
    [part] = split_batch(tb, 0, "token_mean", packed=True, one_row=varlen(model))
    assert part.packing.rows == 1 and part.packing.width == sum(lengths)
    parts = split_batch(tb, 64, "token_mean", packed=True, one_row=True)
    assert all(p.packing.rows == 1 and p.packing.width <= 64 for p in parts)
    assert sorted(i for p in parts for i in p.rows.tolist()) == list(range(len(lengths)))


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("one_row", [False, True])
def test_outputs_and_gradients_equal_padded_rows(tiny_lm, attention, one_row):
    tb = mixed_batch(tiny_lm)
    lengths = tb.attention_mask.sum(dim=1).tolist()
    [rows] = plan_packed(lengths, 0, one_row)
    packing = Packing.build(lengths, rows, tb.input_ids.device)
    assert packing.rows < len(lengths)  # several sequences share a row
    where = response_positions(tb)
    results = {}
    for name in ("padded", "packed"):
        model = copy.deepcopy(tiny_lm.model).train()
        model.set_attn_implementation(attention)
        out = (policy_outputs(model, tb, 0.7, entropy_grad=True, hidden=True) if name == "padded"
               else packed_outputs(model, tb, 0.7, packing, entropy_grad=True, hidden=True))
        (out.logprobs[where].sum() + out.entropy[where].sum()
         + out.hidden[where].square().mean()).backward()
        results[name] = out, {n: p.grad for n, p in model.named_parameters()}
    (padded, padded_grads), (packed, packed_grads) = results["padded"], results["packed"]
    assert packed.logprobs.shape == padded.logprobs.shape
    assert torch.allclose(packed.logprobs[where], padded.logprobs[where], atol=1e-5)
    assert torch.allclose(packed.entropy[where], padded.entropy[where], atol=1e-5)
    assert torch.allclose(packed.hidden[where], padded.hidden[where], atol=1e-5)
    for name, grad in padded_grads.items():
        assert torch.allclose(packed_grads[name], grad, atol=1e-5), name


def one_update(tiny_lm, loss, packing, budget, lora=None):
    torch.manual_seed(0)  # the value head's initial weights
    model = copy.deepcopy(tiny_lm.model)
    tc = TrainerConfig(loss={"name": loss, "kl_coef": 0.05, "entropy_coef": 0.01},
                       optimizer={"lr": 0.5}, updates_per_batch=2, shared_prefix=False,
                       packing=packing, micro_batch_tokens=budget, lora=lora)
    if lora is not None:
        model = with_lora(model, tc.lora)
    objective = Objective(tc, model, MAX_NEW_TOKENS, temperature=1.0)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD([*trained, *objective.parameters()], lr=tc.optimizer.lr)
    model.train()
    return model, objective.update(model, optimizer, mixed_batch(tiny_lm))


def assert_same_update(tiny_lm, padded, packed):
    (padded_model, a), (model, b) = padded, packed
    for key in ("loss", "grad_norm", "policy_loss", "kl_ref", "entropy", "clip_frac"):
        assert b.stats[key] == pytest.approx(a.stats[key], rel=1e-4, abs=1e-6), key
    real = mixed_batch(tiny_lm).response_mask > 0
    assert torch.allclose(b.old_logprobs[real], a.old_logprobs[real], atol=1e-5)
    for (name, x), y in zip(padded_model.state_dict().items(), model.state_dict().values(),
                            strict=True):
        assert torch.allclose(x, y, atol=1e-5), name


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("budget", [0, 48])  # one pass; passes of two or three rows
def test_an_update_equals_the_padded_update(tiny_lm, loss, budget):
    assert_same_update(tiny_lm, one_update(tiny_lm, loss, False, budget),
                       one_update(tiny_lm, loss, True, budget))


def test_a_lora_update_equals_the_padded_update(tiny_lm):
    """The adapter trains through packed rows, and its reference (the base, the adapter
    switched off) scores them too."""
    lora = {"rank": 4, "alpha": 8.0}
    padded = one_update(tiny_lm, "grpo", False, 48, lora)
    packed = one_update(tiny_lm, "grpo", True, 48, lora)
    assert padded[1].stats["kl_ref"] > 0  # the adapter moved off its base within the batch
    assert_same_update(tiny_lm, padded, packed)


def causal_only(module, query, key, value, attention_mask, **kwargs):
    """SDPA that attends causally over the whole row, whatever the mask."""
    return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)


def test_a_model_that_attends_across_sequences_runs_rows_padded(tiny_lm):
    """Its update is the padded one; packed, its sequences would see each other."""
    AttentionInterface.register("causal_only", causal_only)
    assert packs_correctly(copy.deepcopy(tiny_lm.model))
    results = []
    for packing in (False, True):
        model = copy.deepcopy(tiny_lm.model)
        model.set_attn_implementation("causal_only")
        assert not packs_correctly(model)
        tc = TrainerConfig(loss={"name": "grpo", "kl_coef": 0.05}, shared_prefix=False,
                           packing=packing, micro_batch_tokens=0)
        objective = Objective(tc, model, MAX_NEW_TOKENS, temperature=1.0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        results.append((model, objective.update(model.train(), optimizer,
                                                mixed_batch(tiny_lm))))
    assert_same_update(tiny_lm, *results)
    packing = Packing.build(*_one_row(mixed_batch(tiny_lm)))
    across = packed_outputs(results[0][0], mixed_batch(tiny_lm), 1.0, packing).logprobs
    assert not torch.allclose(across, results[0][1].old_logprobs, atol=1e-3)


def _one_row(tb):
    lengths = tb.attention_mask.sum(dim=1).tolist()
    return lengths, plan_packed(lengths, 0, True)[0], tb.input_ids.device


def test_packing_steps_aside_for_the_shared_prefix_pass(tiny_lm):
    model = copy.deepcopy(tiny_lm.model)
    assert not Objective(TrainerConfig(packing=True), model, MAX_NEW_TOKENS, 1.0).packing
    assert Objective(TrainerConfig(shared_prefix=False, packing=True), model, MAX_NEW_TOKENS,
                     1.0).packing
    assert Objective(TrainerConfig(activation_checkpointing=True, packing=True), model,
                     MAX_NEW_TOKENS, 1.0).packing
    assert not Objective(TrainerConfig(shared_prefix=False), model, MAX_NEW_TOKENS,
                         1.0).packing
