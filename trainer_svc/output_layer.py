"""The output layer and the log-softmax over the vocabulary, a few positions at a time.

A pass's next-token log-probabilities and entropies come from [tokens, vocabulary] tensors:
for SmolLM2 (49,152 tokens) a 512-token response window makes 96 MiB per tensor, and the
plain path keeps five of them alive at once around the backward pass (the logits, the window
cut from them, the log-softmax saved for the backward, and their gradients): about half of a
step's activations. Here the decoder's last hidden states go through the output layer
CHUNK_ELEMENTS logits at a time, in an autograd function that keeps only the hidden states
and one log-sum-exp per position, and recomputes each chunk's logits in the backward pass.
The results and gradients are the plain path's up to float rounding
(tests/unit/test_output_layer.py). A pass whose logits fit in one chunk (the tiny model's)
takes the plain path: there is nothing to save.

Models whose logits are not exactly `hidden @ weight.T` (a bias, Gemma 2's final soft-cap,
a scaled head, an output layer that is itself adapted by LoRA or sharded by FSDP) keep the
plain path: `output_weight` checks each model once, by comparing the two on a few tokens.
"""

from __future__ import annotations

import logging
import weakref

import torch
from torch import nn

log = logging.getLogger(__name__)

# Logits computed at once: 32 MiB of float32 per temporary, about 170 positions of
# SmolLM2's vocabulary; the backward pass holds three such temporaries.
CHUNK_ELEMENTS = 1 << 23

_CHECKED: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def chunks(model: nn.Module, positions: int) -> bool:
    """Whether a pass that predicts at `positions` positions runs the output layer in chunks,
    as far as the model's structure tells: its logits exceed one chunk, and its output layer
    is a plain linear map (no bias, not sharded, no soft-cap). output_weight also compares
    the numbers, once per model."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return (type(head) is nn.Linear and head.bias is None
            and not hasattr(head.weight, "full_tensor")  # a DTensor: sharded under torchrun
            and positions * head.weight.shape[0] > CHUNK_ELEMENTS
            # a soft-cap (Gemma 2) is near the identity on the small logits of the check
            and not getattr(getattr(model, "config", None), "final_logit_softcapping", None))


def output_weight(model: nn.Module, positions: int) -> torch.Tensor | None:
    """The output layer's weight when a pass that predicts at `positions` positions runs it
    in chunks (`chunks`) and `model`'s logits are its decoder's last hidden states times
    that weight, transposed (checked once per model, on four tokens); else None: the pass
    takes whole logits."""
    if not chunks(model, positions):
        return None
    weight = model.get_output_embeddings().weight
    if model not in _CHECKED:
        _CHECKED[model] = _logits_are_plain(model, weight)
        if not _CHECKED[model]:
            log.info("%s: logits are not the output layer's alone; the log-softmax runs "
                     "over whole [tokens, vocabulary] logits", type(model).__name__)
    return weight if _CHECKED[model] else None


def _logits_are_plain(model: nn.Module, weight: torch.Tensor) -> bool:
    ids = torch.arange(1, 5, device=weight.device)[None] % weight.shape[0]
    training = model.training
    model.eval()  # no dropout: the two passes must see the same network
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float()
            hidden = model.get_decoder()(input_ids=ids).last_hidden_state
            ours = (hidden @ weight.T).float()
    except Exception as err:  # a model without a separable decoder
        log.info("%s: no separate decoder pass (%s)", type(model).__name__, err)
        return False
    finally:
        model.train(training)
    return logits.shape == ours.shape and torch.allclose(logits, ours, rtol=1e-4, atol=1e-4)


def decoder_hidden(model: nn.Module, **inputs) -> tuple[torch.Tensor, object]:
    """(the decoder's last hidden states, its cache) for `inputs`: the model's forward pass
    without the output layer."""
    out = model.get_decoder()(**inputs)
    return out.last_hidden_state, getattr(out, "past_key_values", None)


def token_stats(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                temperature: float, entropy_grad: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """([..., T] log pi of each target, [..., T] entropy of each distribution) from [..., T, H]
    last hidden states and the output layer's [V, H] weight, as batching.next_token_stats
    gives them from the logits. The entropy has a gradient only if `entropy_grad`."""
    shape = targets.shape
    taken, entropy = _TokenStats.apply(hidden.reshape(-1, hidden.shape[-1]), weight,
                                       targets.reshape(-1), float(temperature),
                                       bool(entropy_grad and torch.is_grad_enabled()))
    return taken.view(shape), entropy.view(shape)


def _chunks(n: int, vocabulary: int) -> list[slice]:
    step = max(1, CHUNK_ELEMENTS // vocabulary)
    return [slice(s, min(s + step, n)) for s in range(0, n, step)]


class _TokenStats(torch.autograd.Function):
    """Per position i with logits z_i = h_i W^T / temperature: log pi(t_i) = z_it - lse(z_i)
    and H_i = -sum_j p_ij log p_ij. Backward, on each chunk's recomputed z:
    d log pi(t_i) / dz_ij = [j = t_i] - p_ij, and dH_i / dz_ij = -p_ij (log p_ij + H_i)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, entropy_grad):
        taken = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        entropy = torch.empty_like(taken)
        lse = torch.empty_like(taken)
        ctx.matmul_dtype = hidden.dtype  # what the chunks' products come out in, below
        for c in _chunks(hidden.shape[0], weight.shape[0]):
            z = hidden[c] @ weight.T  # under autocast in its dtype, as the plain head's
            ctx.matmul_dtype = z.dtype
            z = z.float()
            if temperature != 1.0:
                z /= temperature
            lse[c] = torch.logsumexp(z, dim=-1)
            taken[c] = z.gather(-1, targets[c, None]).squeeze(-1) - lse[c]
            z -= lse[c, None]  # log p, in place
            entropy[c] = -(z.exp() * z).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)  # None for an output without a gradient
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return taken, entropy

    @staticmethod
    def backward(ctx, grad_taken, grad_entropy):
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        w = weight.float()  # no copy for float32 weights
        # z recomputed as the forward pass made it (outside autocast, which backward is)
        w_mm = weight.to(ctx.matmul_dtype)
        grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device) \
            if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(w) if ctx.needs_input_grad[1] else None
        for c in _chunks(hidden.shape[0], weight.shape[0]):
            h = hidden[c]
            # z, then log p, then the gradient at z, in place
            gz = (h.to(ctx.matmul_dtype) @ w_mm.T).float()
            if ctx.temperature != 1.0:
                gz /= ctx.temperature
            gz -= lse[c, None]
            p = gz.exp()
            if grad_entropy is not None:
                gz += entropy[c, None]
                gz *= p
                gz *= -grad_entropy[c, None]
            else:
                gz.zero_()
            if grad_taken is not None:
                p *= grad_taken[c, None]
                gz -= p
                gz.scatter_add_(-1, targets[c, None], grad_taken[c, None].float())
            del p
            if ctx.temperature != 1.0:
                gz /= ctx.temperature
            if grad_hidden is not None:
                grad_hidden[c] = gz @ w
            if grad_weight is not None:
                grad_weight.addmm_(gz.T, h.float())
        return (None if grad_hidden is None else grad_hidden.to(hidden.dtype),
                None if grad_weight is None else grad_weight.to(weight.dtype),
                None, None, None)
