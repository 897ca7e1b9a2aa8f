"""Packed passes (`trainer.packing`): several sequences to a row, each with position ids of
its own, attention confined to it, and no padding between them.

A batch of tool episodes holds sequences of 50 to 768 tokens. Padded, a pass costs rows x its
longest row; sorted by length and split (trainer_svc.micro_batches), the padding shrinks but
each pass still pays for its spread of lengths. Packed, sequences sit end to end in rows, and
a pass costs about its real tokens.

Position ids restart at 0 where each sequence starts, and no 2D attention mask is passed:
transformers then finds the sequences from the position ids (masking_utils.
find_packed_sequence_indices) and makes the causal mask block-diagonal for SDPA and eager
attention, or cuts the row into sequences for the flash-attention kernels (varlen, with
cu_seqlens from the position ids; modeling_flash_attention_utils._is_packed_sequence). The
two ask for different layouts, and `varlen` picks one:

- flash attention: one row per pass. The kernel attends within each sequence, so a row of
  8192 tokens costs what its sequences cost alone, and it takes packed sequences only in a
  batch of one row.
- SDPA and eager: rows as wide as the pass's longest sequence, sequences put into them first
  fit decreasing. The block-diagonal mask is dense, so attention costs a row's width
  squared: one long row would cost far more than the sequences it holds, rows of the longest
  sequence's width cost little more than padded rows of it.

A row's tail after its last sequence is padding, a sequence of its own (its positions start
at 0 too) that no real token attends to. Every per-token tensor goes into rows by the same
`Packing.pack` (input ids, and any other a model's forward takes per token), and the outputs
come back in the padded [B, L-1] layout the losses read (`packed_outputs`): positions outside
each row's response window hold zeros, as under the shared-prefix pass, and no loss reads
them. The output layer and its log-softmax run on the response window alone.

A model whose forward does not take packed sequences this way (a custom attention mask, a
model that ignores position_ids) would attend across them: `packs_correctly` compares one
packed pass with the sequences run alone, once per model, and the trainer runs rows padded
where they differ.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from trainer_svc.batching import PolicyOutputs, TrainBatch, next_token_stats
from trainer_svc.output_layer import decoder_hidden, output_weight, token_stats

log = logging.getLogger(__name__)


def varlen(model: nn.Module) -> bool:
    """Whether `model` attends through a flash-attention kernel, which takes packed
    sequences as one row (varlen); else SDPA or eager, which take rows of a dense mask."""
    from transformers.utils.generic import is_flash_attention_requested

    config = getattr(model, "config", None)
    return config is not None and is_flash_attention_requested(config)


def first_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    """Sequences (their `lengths`) into rows of at most `capacity` tokens, longest first,
    each into the first row with room (a sequence longer than `capacity` alone)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for r, left in enumerate(room):
            if lengths[i] <= left:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(capacity - lengths[i])
    return rows


def plan_packed(lengths: list[int], max_tokens: int, one_row: bool) -> list[list[list[int]]]:
    """Passes of packed rows (each a list of the batch's rows), at most `max_tokens` tokens
    a pass, rows and their padding counted (a sequence longer alone; 0: one pass).
    `one_row` (varlen kernels): each pass is one row; else rows as wide as the longest
    sequence."""
    if one_row:
        return [[row] for row in first_fit(lengths, max_tokens or sum(lengths))]
    width = max(lengths)
    rows = first_fit(lengths, width)
    per_pass = max(1, max_tokens // width) if max_tokens > 0 else len(rows)
    return [rows[s:s + per_pass] for s in range(0, len(rows), per_pass)]


@dataclass(frozen=True)
class Packing:
    """Where each token of a padded batch sits in packed rows. Tokens are listed row by row
    of the batch, each row's in order (`row`, `col`: where in the batch; `at`: the flat
    index into [rows, width])."""

    rows: int
    width: int
    row: torch.Tensor  # [N] the batch row of each real token
    col: torch.Tensor  # [N] its position in that row, which is its position id
    at: torch.Tensor  # [N] its index in the packed rows, flattened
    position_ids: torch.Tensor  # [rows, width]; a row's padding tail counts from 0 too

    @staticmethod
    def build(lengths: list[int], rows: list[list[int]], device: torch.device) -> Packing:
        """`rows`: the batch rows (of `lengths` tokens each) that each packed row holds, in
        order."""
        width = max(sum(lengths[i] for i in r) for r in rows)
        where: list[tuple[int, int]] = [(0, 0)] * len(lengths)  # (packed row, offset)
        positions = []
        for r, members in enumerate(rows):
            offset = 0
            row_positions = []
            for i in members:
                where[i] = (r, offset)
                row_positions += range(lengths[i])
                offset += lengths[i]
            positions.append(row_positions + list(range(width - offset)))
        row = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
        starts = torch.tensor([r * width + o for r, o in where])
        first = torch.cumsum(torch.tensor([0, *lengths[:-1]]), 0)
        col = torch.arange(len(row)) - first[row]
        return Packing(rows=len(rows), width=width, row=row.to(device), col=col.to(device),
                       at=(starts[row] + col).to(device),
                       position_ids=torch.tensor(positions, device=device))

    def pack(self, x: torch.Tensor, fill: int | float = 0) -> torch.Tensor:
        """A per-token tensor of the batch, [B, L, ...], as packed rows [rows, width, ...];
        padding holds `fill`."""
        out = x.new_full((self.rows * self.width, *x.shape[2:]), fill)
        out[self.at] = x[self.row, self.col]
        return out.view(self.rows, self.width, *x.shape[2:])


def response_window(batch: TrainBatch, packing: Packing) -> torch.Tensor:
    """[N] bool over the packing's tokens: those whose next token is a response token (the
    positions prompt_length-1 .. length-2 of each row), which the losses read."""
    lengths = batch.attention_mask.sum(dim=1)
    prompt = batch.prompt_lengths.to(packing.col.device)
    return (packing.col >= prompt[packing.row] - 1) & (packing.col < lengths[packing.row] - 1)


def packed_outputs(model, batch: TrainBatch, temperature: float, packing: Packing, *,
                   entropy_grad: bool = False, hidden: bool = False) -> PolicyOutputs:
    """policy_outputs' results on the response window, from one pass over packed rows."""
    window = response_window(batch, packing)
    at, row, col = packing.at[window], packing.row[window], packing.col[window]
    targets = batch.input_ids[row, col + 1]
    inputs = {"input_ids": packing.pack(batch.input_ids), "position_ids": packing.position_ids,
              # no cache and no 2D mask: what makes transformers read sequences from the
              # position ids (masking_utils._preprocess_mask_arguments)
              "use_cache": False}
    weight = output_weight(model, len(at))
    if weight is not None:  # the output layer a chunk of positions at a time
        h, _ = decoder_hidden(model, **inputs)
        h = h.reshape(-1, h.shape[-1])[at]
        taken, entropy = token_stats(h, weight, targets, temperature, entropy_grad)
    else:
        out = model(**inputs, output_hidden_states=hidden)
        logits = out.logits.reshape(-1, out.logits.shape[-1])[at]
        taken, entropy = next_token_stats(logits[None], targets[None], temperature,
                                          entropy_grad)
        taken, entropy = taken[0], entropy[0]
        h = out.hidden_states[-1].reshape(-1, out.hidden_states[-1].shape[-1])[at] \
            if hidden else None
    shape = (batch.input_ids.shape[0], batch.input_ids.shape[1] - 1)

    def in_rows(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros((*shape, *values.shape[1:])).index_put((row, col), values)

    return PolicyOutputs(logprobs=in_rows(taken), entropy=in_rows(entropy),
                         hidden=in_rows(h) if hidden else None)


_CHECKED: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def packs_correctly(model: nn.Module) -> bool:
    """Whether `model` keeps packed sequences apart: two sequences of four and three tokens
    in one row give the logits each gives alone (checked once per model)."""
    if model in _CHECKED:
        return _CHECKED[model]
    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().weight.shape[0]
    seqs = [torch.arange(1, 5, device=device) % vocab, torch.arange(5, 8, device=device) % vocab]
    training = model.training
    model.eval()  # no dropout: the passes must see the same network
    try:
        with torch.no_grad():
            alone = [model(input_ids=s[None], use_cache=False).logits[0] for s in seqs]
            positions = torch.cat([torch.arange(len(s), device=device) for s in seqs])
            packed = model(input_ids=torch.cat(seqs)[None], position_ids=positions[None],
                           use_cache=False).logits[0]
        # bfloat16 (FSDP's gathered weights) rounds unlike shapes apart by about 1e-2;
        # attending across the sequences moves the second one's logits by far more
        tol = 1e-4 if packed.dtype == torch.float32 else 3e-2
        ok = torch.allclose(packed.float(), torch.cat(alone).float(), rtol=tol, atol=tol)
    except Exception as err:  # a model that takes no position_ids
        log.info("%s: no packed pass (%s)", type(model).__name__, err)
        ok = False
    finally:
        model.train(training)
    if not ok:
        log.info("%s attends across packed sequences; its rows run padded",
                 type(model).__name__)
    _CHECKED[model] = ok
    return ok
