"""A batch passed forward and backward in parts: rows of like length together, each part cut
to its own longest row.

Padded to its longest response, a long-tailed batch costs rows x longest tokens per pass,
most of it padding. Sorted by length and split, it costs little more than its real tokens.
The split is the one that minimises padded tokens plus a fixed cost per pass, with no part
over `trainer.micro_batch_tokens` (which also bounds a pass's activations). Under the
shared-prefix pass (trainer_svc.shared_prefix) a part costs its distinct prompts once plus
rows x its longest response. Two plans are weighed by that cost: rows of like response
length across prompts (each pass paying for every prompt it touches), and each prompt's rows
kept together, several prompts to a pass where they fit. Short prompts mostly favour the
first; long ones the second: a tool episode's prompt (a system message declaring the tools,
worked calls) is several times its answers, and paid again in every pass that holds one of
its rows it would be most of the step.

Under `trainer.packing` (trainer_svc.packing) a part is rows of sequences put end to end,
at most `trainer.micro_batch_tokens` tokens with the rows' padding tails: the part's
sequences still arrive at the loss as rows of their own (its `batch`, cut to its longest),
and only the forward pass takes the packed rows (its `packing`).

Every loss is a sum over rows divided by the batch's normaliser (its response tokens, or
its sequences: trainer_svc.distributed.normaliser), so a part's loss weighted by its share
of that normaliser adds up to the whole batch's: the same split torchrun ranks rely on."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from relayrl_torch.sampling.length_split import plan_runs
from trainer_svc.batching import TrainBatch, select_rows
from trainer_svc.distributed import normaliser
from trainer_svc.packing import Packing, plan_packed
from trainer_svc.shared_prefix import prompt_sharing

# What one more forward and backward pass costs beyond its tokens, in tokens' worth: about
# 10 ms of framework overhead against ~0.14 ms per token for the tiny model on one CPU thread.
PASS_COST_TOKENS = 64


@dataclass
class MicroBatch:
    rows: torch.Tensor  # the part's rows of the batch
    width: int  # tokens per row: its longest row's
    weight: float  # its share of the batch's loss normaliser
    batch: TrainBatch  # its rows, cut to `width`
    packing: Packing | None = None  # where its rows sit in packed rows, when packed

    def take(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """The part's share of a per-row tensor of the batch: [B] or [B, L-1] (cut)."""
        if x is None:
            return None
        x = x[self.rows]
        return x[:, :self.width - 1] if x.dim() > 1 else x


def plan_parts(lengths: list[int], max_tokens: int, prefix_tokens: int = 0
               ) -> list[list[int]]:
    """Rows grouped into parts (relayrl_torch.sampling.length_split) within `max_tokens` padded
    tokens each (a row longer than that alone); `max_tokens` 0: one part. `prefix_tokens`: what
    every pass runs besides its rows' `lengths` (the shared-prefix pass's prompts)."""
    if max_tokens <= 0 or len(lengths) <= 1:
        return [sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))]
    return plan_runs(lengths, PASS_COST_TOKENS + prefix_tokens, max_tokens)


def shared_cost(parts: list[list[int]], windows: list[int], prompt_of: list[int],
                prompt_tokens: list[int]) -> int:
    """What the shared-prefix passes over `parts` cost in tokens: each part its distinct
    prompts once, rows x its longest response window, and the pass cost."""
    return sum(PASS_COST_TOKENS + sum(prompt_tokens[p] for p in {prompt_of[i] for i in part})
               + len(part) * max(windows[i] for i in part) for part in parts)


def plan_shared_parts(windows: list[int], prompt_of: list[int], prompt_tokens: list[int],
                      max_tokens: int) -> list[list[int]]:
    """Rows (response `windows`, row i's prompt `prompt_of[i]` of `prompt_tokens[...]`
    tokens) grouped into shared-prefix passes of at most `max_tokens` response tokens each
    (padded; a row longer than that alone): the cheaper, by shared_cost, of rows of like
    length across prompts and each prompt's rows kept together."""
    if max_tokens <= 0 or len(windows) <= 1:
        return plan_parts(windows, max_tokens)
    across = plan_parts(windows, max_tokens, sum(prompt_tokens))
    together = _pack([[rows[j] for j in chunk]
                      for p, rows in _rows_by_prompt(prompt_of).items()
                      for chunk in plan_runs([windows[i] for i in rows],
                                             PASS_COST_TOKENS + prompt_tokens[p], max_tokens)],
                     windows, prompt_of, prompt_tokens, max_tokens)
    return min((across, together),
               key=lambda plan: shared_cost(plan, windows, prompt_of, prompt_tokens))


def _rows_by_prompt(prompt_of: list[int]) -> dict[int, list[int]]:
    rows: dict[int, list[int]] = {}
    for i, p in enumerate(prompt_of):
        rows.setdefault(p, []).append(i)
    return rows


def _pack(units: list[list[int]], windows: list[int], prompt_of: list[int],
          prompt_tokens: list[int], max_tokens: int) -> list[list[int]]:
    """Units of rows (one prompt's each) put into passes, several to a pass where they fit:
    ordered by their longest window and cut into consecutive runs minimising the runs'
    shared_cost (as relayrl_torch.sampling.length_split plans rows)."""
    units = sorted(units, key=lambda u: (-max(windows[i] for i in u), u[0]))
    longest = [max(windows[i] for i in u) for u in units]
    prompts = [prompt_tokens[prompt_of[u[0]]] for u in units]
    n = len(units)
    best, start = [0] + [None] * n, [0] * (n + 1)
    for end in range(1, n + 1):
        rows = prompt = 0
        for a in range(end - 1, -1, -1):  # the last run: units a..end-1, longest first
            rows += len(units[a])
            prompt += prompts[a]
            padded = rows * longest[a]
            if padded > max_tokens and end - a > 1:
                break  # a longer run only pads more
            cost = best[a] + PASS_COST_TOKENS + prompt + padded
            if best[end] is None or cost < best[end]:
                best[end], start[end] = cost, a
    runs, end = [], n
    while end > 0:
        runs.append([i for u in units[start[end]:end] for i in u])
        end = start[end]
    return runs[::-1]


def split_batch(tb: TrainBatch, max_tokens: int, aggregation: str,
                shared_prefix: bool = False, packed: bool = False,
                one_row: bool = False) -> list[MicroBatch]:
    """`shared_prefix`: the parts will take the shared-prefix pass (planned as above).
    `packed`: each part's sequences are packed into rows (trainer_svc.packing.plan_packed;
    `one_row` for varlen attention kernels)."""
    row_lengths = tb.attention_mask.sum(dim=1)  # right-padded: a row's real length
    lengths = row_lengths.tolist()
    packed_rows = plan_packed(lengths, max_tokens, one_row) if packed else None
    if packed_rows is not None:
        plan = [[i for row in rows for i in row] for rows in packed_rows]
    elif shared_prefix:
        first, inverse = prompt_sharing(tb)
        windows = (row_lengths - tb.prompt_lengths).tolist()
        plan = plan_shared_parts(windows, inverse.tolist(), tb.prompt_lengths[first].tolist(),
                                 max_tokens)
    else:
        plan = plan_parts(lengths, max_tokens)
    device = tb.input_ids.device
    if len(plan) == 1:
        packing = None if packed_rows is None else Packing.build(lengths, packed_rows[0], device)
        return [MicroBatch(torch.arange(len(lengths)), tb.input_ids.shape[1], 1.0, tb, packing)]
    whole = normaliser(aggregation, tb.response_mask).clamp(min=1.0)
    full = tb.input_ids.shape[1]
    parts = []
    for k, rows in enumerate(plan):
        index = torch.tensor(rows, dtype=torch.long)
        # its longest row (2: one prediction)
        width = min(max(max(int(lengths[i]) for i in rows), 2), full)
        rows_only = select_rows(tb, index, device)
        part = TrainBatch(**{f.name: _cut(getattr(rows_only, f.name), width, full)
                             for f in fields(tb)})
        weight = (normaliser(aggregation, part.response_mask) / whole).item()
        packing = None if packed_rows is None else _local_packing(packed_rows[k], lengths,
                                                                   device)
        parts.append(MicroBatch(index, width, weight, part, packing))
    return parts


def _local_packing(rows: list[list[int]], lengths: list[int], device: torch.device
                   ) -> Packing:
    """A part's packing, its rows numbered as in the part (the order of `rows`)."""
    local, n = [], 0
    for row in rows:
        local.append(list(range(n, n + len(row))))
        n += len(row)
    return Packing.build([lengths[i] for row in rows for i in row], local, device)


def idle_part(part: MicroBatch) -> MicroBatch:
    """A pass that changes nothing (weight 0): under torchrun a rank with fewer parts than
    another runs these, since every pass joins the ranks' collectives."""
    return replace(part, weight=0.0)


def _cut(x: torch.Tensor, width: int, full: int) -> torch.Tensor:
    """A per-row tensor cut to `width` tokens: [B, full] to width, [B, full-1] to width-1."""
    if x.dim() < 2:
        return x
    return x[:, :width if x.shape[1] == full else width - 1]


def assemble(parts: list[MicroBatch], pieces: list[torch.Tensor], like: torch.Tensor
             ) -> torch.Tensor:
    """Per-token pieces of the parts ([b, width-1] each) put back into one tensor shaped
    like `like` ([B, L-1]), zero past each row's part."""
    if len(parts) == 1:
        return pieces[0]
    out = torch.zeros_like(like, dtype=pieces[0].dtype)
    for part, piece in zip(parts, pieces, strict=True):
        out[part.rows, :piece.shape[1]] = piece
    return out


LOSS_TERMS = ("loss", "policy_loss")  # aggregated like the loss; other stats are token means


def combine_stats(per_part: list[tuple[dict[str, float], MicroBatch]]) -> dict[str, float]:
    """One set of stats for the batch: maxima (`*_max`) over the parts, the loss terms
    weighted by each part's share of the normaliser (exact), the rest by its share of the
    response tokens (exact for token means, close for per-sequence ones)."""
    if len(per_part) == 1:
        return dict(per_part[0][0])
    tokens = [float(part.batch.response_mask.sum()) if part.weight else 0.0
              for _, part in per_part]  # an idle part's tokens are another's
    token_weights = [t / sum(tokens) if sum(tokens) else 1.0 / len(tokens) for t in tokens]
    out = {}
    for key in per_part[0][0]:
        values = [stats[key] for stats, _ in per_part]
        if key.endswith("_max"):
            out[key] = max(values)
        elif key in LOSS_TERMS:
            out[key] = sum(v * part.weight for v, (_, part) in zip(values, per_part, strict=True))
        else:
            out[key] = sum(v * w for v, w in zip(values, token_weights, strict=True))
    return out
