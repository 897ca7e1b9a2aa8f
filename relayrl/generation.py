"""Batched sampling with a KV cache that records each token's log-probability.

Prompts are left-padded and given explicit position ids, so a sequence's positions do not
depend on what it is batched with; the trainer's recomputation sees the same positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Completion:
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (emitted eos) or "length"


@torch.no_grad()
def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids right-aligned in one [B, width] tensor, and the mask of real tokens."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s)
        mask[i, width - len(s):] = 1
    return ids, mask


def sample(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    temperature: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> list[Completion]:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: every prompt needs at least one token")
    batch = len(prompts)
    input_ids, mask = left_pad(prompts, pad_id)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)

    out_tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long)
    out_logprobs = torch.zeros((batch, max_new_tokens))
    lengths = torch.full((batch,), max_new_tokens, dtype=torch.long)
    finished = torch.zeros(batch, dtype=torch.bool)
    past = None
    step_ids, step_pos = input_ids, positions
    for t in range(max_new_tokens):
        out = model(
            input_ids=step_ids, attention_mask=mask, position_ids=step_pos,
            past_key_values=past, use_cache=True,
        )
        past = out.past_key_values
        logp = torch.log_softmax(out.logits[:, -1, :].float() / temperature, dim=-1)
        if greedy:
            tok = logp.argmax(-1)
        else:
            tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        tok = torch.where(finished, torch.full_like(tok, pad_id), tok)
        out_tokens[:, t] = tok
        out_logprobs[:, t] = logp.gather(-1, tok[:, None]).squeeze(-1)
        newly_done = (~finished) & (tok == eos_id)
        lengths[newly_done] = t + 1
        finished |= newly_done
        if bool(finished.all()):
            break
        step_ids = tok[:, None]
        step_pos = step_pos[:, -1:] + 1
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], dim=-1)

    results = []
    for i in range(batch):
        n = int(lengths[i])
        results.append(
            Completion(
                tokens=out_tokens[i, :n].tolist(),
                logprobs=out_logprobs[i, :n].tolist(),
                finish_reason="stop" if bool(finished[i]) and n <= max_new_tokens else "length",
            )
        )
    return results
