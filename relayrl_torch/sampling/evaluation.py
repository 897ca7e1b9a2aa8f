"""Held-out accuracy of a policy on a task, sampled and greedy."""

from __future__ import annotations

import torch

from relayrl.plugins.tasks import Problem
from relayrl_tasks.rewards import get_reward, score
from relayrl_torch.models.loading import LoadedModel
from relayrl_torch.sampling.sampler import sample


@torch.no_grad()
def evaluate(
    lm: LoadedModel,
    problems: list[Problem],
    reward_name: str,
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int = 0,
    batch_size: int = 256,
) -> dict[str, float]:
    """Mean reward when sampling at `temperature` (what RL optimises) and when greedy."""
    if not problems:
        return {}
    fn = get_reward(reward_name)
    was_training = lm.model.training
    lm.model.eval()
    gen = torch.Generator().manual_seed(seed)
    totals = {"sampled": 0.0, "greedy": 0.0}
    for start in range(0, len(problems), batch_size):
        chunk = problems[start:start + batch_size]
        prompts = [lm.encode_problem(p.text, p.messages) for p in chunk]
        for mode in totals:
            outs = sample(
                lm.model, prompts, max_new_tokens=max_new_tokens, eos_ids=lm.eos_ids,
                pad_id=lm.pad_id, temperature=temperature, greedy=mode == "greedy", generator=gen,
            )
            for p, c in zip(chunk, outs, strict=True):
                totals[mode] += score(fn, lm.decode(c.tokens), p.reference, metadata=p.metadata)[0]
    lm.model.train(was_training)
    return {f"accuracy_{k}": v / len(problems) for k, v in totals.items()}
