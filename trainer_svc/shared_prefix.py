"""The policy's forward pass with each distinct prompt run once (`trainer.shared_prefix`).

A GRPO batch holds G prompts with S samples each, and the plain pass runs every prompt S
times. Under causal attention a prompt's keys and values are the same in every row that
starts with it, so this pass runs each distinct prompt once, selects its KV cache into its
rows, and runs the responses against it. Gradients flow back through the cache, so the
prompt's part of the backward pass is shared too. Log-probabilities and gradients are the
plain pass's up to float rounding (tests/unit/test_shared_prefix.py).

The tiny example's rows are 7 prompt and about 4 response tokens: the pass runs 2.2x fewer
tokens, and a step's forward and backward take 55 ms instead of 84 on one thread. The
log-softmax runs over the response window only, which is what saves most for a large
vocabulary. A pass where no two rows share a prompt takes this path too (one more call into
the model, at no more tokens): every pass of a step takes the same path, so one process and
torchrun ranks, whose shares of a batch differ, compute alike.

Outputs come back in the plain pass's [B, L-1] layout; positions outside a row's response
hold zeros, and no loss reads them (their response mask is 0).
"""

from __future__ import annotations

import torch

from relayrl_torch.models.routing import replayed
from trainer_svc.batching import PolicyOutputs, TrainBatch, next_token_stats
from trainer_svc.output_layer import decoder_hidden, output_weight, token_stats


def prompt_sharing(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(the first row of each distinct prompt, each row's index into those)."""
    distinct, inverse = torch.unique(batch.prefix_ids, return_inverse=True)
    rows, device = len(inverse), inverse.device
    first = torch.full((len(distinct),), rows, dtype=torch.long, device=device).scatter_reduce(
        0, inverse, torch.arange(rows, device=device), reduce="amin")
    return first, inverse


def _into_rows(window: torch.Tensor, starts: torch.Tensor, width: int) -> torch.Tensor:
    """[B, R, ...] response-window values put at positions starts+j of a [B, width, ...]
    tensor of zeros (with autograd; the window's masked tail lands past `width` or on
    padding)."""
    b, r = window.shape[:2]
    index = (starts[:, None] + torch.arange(r, device=window.device))
    index = index.view(b, r, *([1] * (window.dim() - 2))).expand_as(window)
    out = window.new_zeros((b, width + r, *window.shape[2:]))
    return out.scatter(1, index, window)[:, :width]


def shared_prefix_outputs(model, batch: TrainBatch, temperature: float,
                          sharing: tuple[torch.Tensor, torch.Tensor], *,
                          entropy_grad: bool = False, hidden: bool = False) -> PolicyOutputs:
    """policy_outputs' results from one pass over the distinct prompts and one over every
    row's response against its prompt's cache. `sharing` is prompt_sharing(batch)."""
    from transformers import DynamicCache

    first, inverse = sharing
    device = batch.input_ids.device
    width = batch.input_ids.shape[1]
    prompt_len = batch.prompt_lengths.to(device)
    lengths = batch.attention_mask.sum(dim=1)
    p = int(prompt_len.max())
    r = max(int((lengths - prompt_len).max()), 1)

    # the prompts, right-padded: what follows a prompt in its first row is masked out
    p_mask = (torch.arange(p, device=device) < prompt_len[first, None]).long()
    j = torch.arange(r, device=device)
    at = prompt_len[:, None] + j  # where response token j sits in the row
    r_mask = (at < lengths[:, None]).long()
    targets = batch.input_ids.gather(1, at.clamp(max=width - 1))
    prompt_inputs = {"input_ids": batch.input_ids[first, :p], "attention_mask": p_mask,
                     "past_key_values": DynamicCache(config=model.config), "use_cache": True}
    response_inputs = {"input_ids": targets, "position_ids": at, "use_cache": True,
                       "attention_mask": torch.cat([p_mask[inverse], r_mask], dim=1)}
    # each pass replays its own positions' routes (relayrl_torch.models.routing)
    prompt_routes = batch.routes[first, :p]
    rows = torch.arange(len(inverse), device=device)[:, None]
    response_routes = batch.routes[rows, at.clamp(max=width - 1)]

    def window(last: torch.Tensor, response_out: torch.Tensor) -> torch.Tensor:
        """Per-position outputs that predict response tokens 0..r-1: each row's prompt's
        last position (`last`, [B, ...]), then the responses' own positions but the last."""
        return torch.cat([last[:, None], response_out[:, :-1]], dim=1)

    def in_rows(window: torch.Tensor) -> torch.Tensor:
        return _into_rows(window, prompt_len - 1, width - 1)

    weight = output_weight(model, targets.numel())
    if weight is not None:  # the output layer a chunk of positions at a time
        with replayed(model, prompt_routes):
            prompt_h, cache = decoder_hidden(model, **prompt_inputs)
        cache.batch_select_indices(inverse)
        with replayed(model, response_routes):
            response_h, _ = decoder_hidden(model, **response_inputs, past_key_values=cache)
        h = window(prompt_h[inverse, prompt_len - 1], response_h)
        taken, entropy = token_stats(h, weight, targets, temperature, entropy_grad)
        return PolicyOutputs(logprobs=in_rows(taken * r_mask), entropy=in_rows(entropy),
                             hidden=in_rows(h) if hidden else None)

    # a prompt's logits are read at its last position alone: the output layer runs on those
    # positions only (a few instead of every prompt token, [tokens, vocabulary] each)
    ends, end_of = torch.unique(prompt_len[first] - 1, return_inverse=True)
    with replayed(model, prompt_routes):
        prompts = model(**prompt_inputs, output_hidden_states=hidden, logits_to_keep=ends)
    cache = prompts.past_key_values
    cache.batch_select_indices(inverse)
    with replayed(model, response_routes):
        responses = model(**response_inputs, past_key_values=cache,
                          output_hidden_states=hidden)
    taken, entropy = next_token_stats(
        window(prompts.logits[inverse, end_of[inverse]], responses.logits), targets,
        temperature, entropy_grad)
    return PolicyOutputs(
        logprobs=in_rows(taken * r_mask), entropy=in_rows(entropy),
        hidden=in_rows(window(prompts.hidden_states[-1][inverse, prompt_len - 1],
                              responses.hidden_states[-1])) if hidden else None,
    )
