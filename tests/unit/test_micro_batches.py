"""Micro-batches: the split of a batch's rows (relayrl_torch.sampling.length_split, tested on
its own in test_length_split.py) under the trainer's budget, and the update through parts,
which must equal the update through the whole padded batch."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relayrl.config import TrainerConfig
from tests.unit.test_losses_trainer import MAX_NEW_TOKENS, tiny_batch
from trainer_svc.losses import LOSSES
from trainer_svc.micro_batches import (
    PASS_COST_TOKENS,
    assemble,
    plan_parts,
    plan_shared_parts,
    shared_cost,
    split_batch,
)
from trainer_svc.objective import Objective


def cost(lengths, parts):
    return sum(len(p) * max(lengths[i] for i in p) + PASS_COST_TOKENS for p in parts)


def test_no_budget_is_one_part_and_a_long_tail_is_split():
    lengths = [200] + [20] * 31
    assert len(plan_parts(lengths, 0)) == 1
    parts = plan_parts(lengths, 8192)
    assert [len(p) for p in parts] == [1, 31]
    assert cost(lengths, parts) < 0.2 * (32 * 200)


def test_under_a_shared_prefix_short_answers_stay_one_pass_and_a_long_tail_splits():
    """Planned on responses, with the distinct prompts paid again in every pass: SmolLM2's
    chat sums (4 prompts of 44 tokens, answers of 6-16) are one pass, which the plain plan
    on whole rows cut in two (measured slower: 5.4-6.3 s a step against 4.0-4.4)."""
    prompts = 4 * 44
    answers = [16] * 8 + [6] * 24
    assert len(plan_parts([44 + n for n in answers], 8192)) == 2
    assert len(plan_parts(answers, 8192, prompts)) == 1
    tail = [2000] + [20] * 31
    assert [len(p) for p in plan_parts(tail, 8192, prompts)] == [1, 31]


def test_long_prompts_keep_their_rows_together():
    """A tool episode's prompt (tools declared, worked calls: 350 tokens) against answers of
    30-120: split by length across prompts, each of three passes runs all four prompts; kept
    together, each prompt runs once and the step costs a fifth fewer tokens."""
    windows = [120, 30, 45, 60, 90, 35, 50, 80] * 4
    prompt_of = [i // 8 for i in range(32)]
    prompts = [350] * 4
    across = plan_parts(windows, 1024, sum(prompts))
    plan = plan_shared_parts(windows, prompt_of, prompts, 1024)
    assert len(across) == 3 and all({prompt_of[i] for i in p} == {0, 1, 2, 3} for p in across)
    assert sorted(len({prompt_of[i] for i in p}) for p in plan) == [1, 1, 1, 1]
    assert shared_cost(plan, windows, prompt_of, prompts) < \
        0.85 * shared_cost(across, windows, prompt_of, prompts)


def test_short_prompts_and_like_answers_stay_one_pass():
    assert len(plan_shared_parts([10] * 32, [i // 8 for i in range(32)], [44] * 4, 8192)) == 1
    assert len(plan_shared_parts([10] * 32, [i // 8 for i in range(32)], [44] * 4, 0)) == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 5)), min_size=1, max_size=40),
       st.lists(st.integers(1, 600), min_size=6, max_size=6), st.integers(1, 4096))
def test_a_shared_plan_covers_every_row_once_within_budget_at_no_more_cost(rows, prompts,
                                                                          budget):
    windows, prompt_of = [w for w, _ in rows], [p for _, p in rows]
    plan = plan_shared_parts(windows, prompt_of, prompts, budget)
    assert sorted(i for part in plan for i in part) == list(range(len(rows)))
    for part in plan:
        assert len(part) == 1 or len(part) * max(windows[i] for i in part) <= budget
    across = plan_parts(windows, budget, sum(prompts))
    assert shared_cost(plan, windows, prompt_of, prompts) <= \
        shared_cost(across, windows, prompt_of, prompts)


def test_parts_are_the_batch_rows_cut_to_their_longest(tiny_lm):
    tb = tiny_batch(tiny_lm)
    parts = split_batch(tb, max_tokens=1, aggregation="token_mean")
    assert len(parts) == tb.input_ids.shape[0]
    assert sum(p.weight for p in parts) == pytest.approx(1.0)
    for part in parts:
        row = int(part.rows[0])
        length = int(tb.attention_mask[row].sum())
        assert part.width == length
        assert torch.equal(part.batch.input_ids[0], tb.input_ids[row, :length])
        assert torch.equal(part.batch.response_mask[0], tb.response_mask[row, :length - 1])
        # what was cut is padding: no attention, no response token
        assert tb.attention_mask[row, length:].sum() == 0
        assert tb.response_mask[row, length - 1:].sum() == 0
    pieces = [p.batch.behaviour_logprobs for p in parts]
    assert torch.equal(assemble(parts, pieces, tb.behaviour_logprobs), tb.behaviour_logprobs)


def one_update(tiny_lm, loss, micro_batch_tokens):
    torch.manual_seed(0)  # the value head's initial weights
    model = copy.deepcopy(tiny_lm.model)
    tc = TrainerConfig(loss={"name": loss, "kl_coef": 0.05, "entropy_coef": 0.01},
                       optimizer={"lr": 0.5},
                       updates_per_batch=2, micro_batch_tokens=micro_batch_tokens)
    objective = Objective(tc, model, MAX_NEW_TOKENS, temperature=1.0)
    # plain SGD: Adam's per-parameter normalisation would blow float noise in near-zero
    # gradients up to the size of a step
    optimizer = torch.optim.SGD([*model.parameters(), *objective.parameters()],
                                lr=tc.optimizer.lr)
    model.train()
    result = objective.update(model, optimizer, tiny_batch(tiny_lm))
    return model, objective, result


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("budget", [1, 8])
def test_an_update_through_parts_equals_the_whole_batch_update(tiny_lm, loss, budget):
    whole_model, whole_obj, whole = one_update(tiny_lm, loss, 0)
    model, obj, split = one_update(tiny_lm, loss, budget)
    assert whole.stats["micro_batches"] == 1 and split.stats["micro_batches"] > 1
    for key in ("loss", "grad_norm", "policy_loss", "kl_ref", "entropy", "clip_frac"):
        assert split.stats[key] == pytest.approx(whole.stats[key], rel=1e-4, abs=1e-6), key
    real = tiny_batch(tiny_lm).response_mask > 0  # past a row's end there is only padding
    assert torch.allclose(split.old_logprobs[real], whole.old_logprobs[real], atol=1e-5)
    for (name, a), b in zip(whole_model.state_dict().items(), model.state_dict().values(),
                            strict=True):
        assert torch.allclose(a, b, atol=1e-5), name
    for a, b in zip(whole_obj.parameters(), obj.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
