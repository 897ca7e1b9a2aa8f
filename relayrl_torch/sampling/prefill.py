"""Prefill of contexts of very different lengths in a few length buckets, not one padded batch.

A batch's first forward pads every context to the longest. Under continuous batching that is
the common case: after a weight swap every kept KV state is void, and the batch mixes fresh
prompts of ten tokens with long-tail sequences of hundreds, so one padded forward computes
mostly padding (32 rows x 200 columns for 31 short rows and one long one). Prefill costs
about the same per token at any batch size, so the rows that need it are run in buckets of
similar length (relayrl_torch.sampling.length_split), each bucket's state is split out per sequence
(relayrl_torch.sampling.kv_batch), and the sampler resumes every row from its state as it would
from one kept from an earlier call.
"""

from __future__ import annotations

import torch

from relayrl_torch.devices import model_device
from relayrl_torch.sampling import kv_batch
from relayrl_torch.sampling.kv_state import ModelFingerprint, SequenceKV
from relayrl_torch.sampling.length_split import padded_cost, plan_runs

# One more forward call costs about as much as this many padded tokens (per-call overhead
# of a small model on CPU, measured: ~3 ms a call against ~60 us a prefilled token).
CALL_COST_TOKENS = 64


def worth_bucketing(fed: list[int], rows: list[int], covered_lengths: list[int]) -> bool:
    """Whether prefilling `rows` (their contexts but the last token: `covered_lengths`) in
    buckets, then feeding each of them one token, beats one first forward feeding every row
    `fed` tokens padded to the longest."""
    buckets = plan_runs(covered_lengths, CALL_COST_TOKENS)
    if len(buckets) < 2:
        return False
    chosen = set(rows)
    after = [1 if i in chosen else n for i, n in enumerate(fed)]
    bucketed = padded_cost(after, CALL_COST_TOKENS) + sum(
        padded_cost([covered_lengths[j] for j in b], CALL_COST_TOKENS) for b in buckets)
    return bucketed < padded_cost(fed, CALL_COST_TOKENS)


def left_pad(seqs: list[list[int]], pad_id: int, device: torch.device | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids right-aligned in one [B, width] tensor, and the mask of real tokens, on
    `device` (built on the CPU, then copied over at once)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s)
        mask[i, width - len(s):] = 1
    if device is not None and device.type != "cpu":
        return ids.to(device), mask.to(device)
    return ids, mask


@torch.no_grad()
def prefill_states(model, contexts: list[list[int]], pad_id: int, version: int,
                   fingerprint: ModelFingerprint) -> list[SequenceKV]:
    """The KV state of each context, computed in length buckets."""
    states: list[SequenceKV | None] = [None] * len(contexts)
    for bucket in plan_runs([len(c) for c in contexts], CALL_COST_TOKENS):
        ids, mask = left_pad([contexts[i] for i in bucket], pad_id, model_device(model))
        out = model(input_ids=ids, attention_mask=mask,  # the cache is wanted, not logits
                    position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=True,
                    logits_to_keep=1)
        split = kv_batch.split(out.past_key_values, mask, [contexts[i] for i in bucket],
                               version, fingerprint)
        for i, state in zip(bucket, split, strict=True):
            states[i] = state
    assert all(s is not None for s in states)
    return states  # type: ignore[return-value]
