"""RelayRL's GRPO step against the textbook one, written out as TRL's GRPOTrainer computes it
(loss_type "grpo", one update per batch, no KL): per token -min(r A, clip(r, 1 - eps, 1 + eps)
A) with r = pi / sg(pi), a token mean per sequence, the mean over sequences, the gradient norm
clipped, one AdamW step. On the same on-policy batch both must leave the same weights, so a
gap in learning per step between RelayRL and a single-process trainer (bench/peers.py) is
the samples' age, not the update."""

import copy

import torch

from relayrl.config import TrainerConfig
from tests.unit.test_shared_prefix import MAX_NEW_TOKENS, varied_batch
from trainer_svc.objective import Objective

LR, CLIP_EPS = 1e-3, 0.2


def reference_step(model, tb) -> None:
    logits = model(input_ids=tb.input_ids, attention_mask=tb.attention_mask).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, tb.input_ids[:, 1:, None])[..., 0]
    ratio = torch.exp(logp - logp.detach())
    adv = tb.advantages[:, None]
    per_token = -torch.min(ratio * adv, ratio.clamp(1 - CLIP_EPS, 1 + CLIP_EPS) * adv)
    mask = tb.response_mask
    loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def test_the_grpo_step_is_the_reference_step(tiny_lm):
    tb = varied_batch(tiny_lm)
    start = {n: p.detach().clone() for n, p in tiny_lm.model.named_parameters()}
    ours, ref = copy.deepcopy(tiny_lm.model).train(), copy.deepcopy(tiny_lm.model).train()
    # on-policy: the behaviour log-probs are the policy's own, as TRL's are
    with torch.no_grad():
        logits = ours(input_ids=tb.input_ids, attention_mask=tb.attention_mask).logits[:, :-1]
        own = torch.log_softmax(logits.float(), -1).gather(-1, tb.input_ids[:, 1:, None])[..., 0]
    tb.behaviour_logprobs = torch.where(tb.response_mask > 0, own, 0.0)
    tc = TrainerConfig(loss={"name": "grpo", "clip_eps": CLIP_EPS},
                       optimizer={"lr": LR, "grad_clip": 1.0})
    objective = Objective(tc, ours, MAX_NEW_TOKENS, temperature=1.0)
    objective.update(ours, torch.optim.AdamW(ours.parameters(), lr=LR, weight_decay=0.0), tb)
    reference_step(ref, tb)
    moved = 0
    for (name, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        # to a hundredth of AdamW's step: where a gradient is near zero, float rounding of
        # the two passes is part of the step it takes
        assert torch.allclose(a, b, atol=LR / 100), name
        moved += int(not torch.equal(a, start[name]))
    assert moved > len(start) // 2  # the step changed the weights: the comparison means something
