"""Prefill of contexts of very different lengths in a few length buckets, not one padded batch.

A batch's first forward pads every context to the longest. Under continuous batching that is
the common case: after a weight swap every kept KV state is void, and the batch mixes fresh
prompts of ten tokens with long-tail sequences of hundreds, so one padded forward computes
mostly padding (32 rows x 200 columns for 31 short rows and one long one). Prefill costs
about the same per token at any batch size, so the rows that need it are run in buckets of
similar length, each bucket's state is split out per sequence (relayrl.kv_state), and the
sampler resumes every row from its state as it would from one kept from an earlier call.
"""

from __future__ import annotations

import torch

from relayrl import kv_state
from relayrl.kv_state import ModelFingerprint, SequenceKV

# One more forward call costs about as much as this many padded tokens (per-call overhead
# of a small model on CPU, measured: ~3 ms a call against ~60 us a prefilled token).
CALL_COST_TOKENS = 64
MAX_DISTINCT_LENGTHS = 256  # beyond this, lengths are rounded up to plan in O(256^2)


def plan_buckets(lengths: list[int], call_cost: int | None = None) -> list[list[int]]:
    """Indices of `lengths` grouped into forward calls of consecutive lengths (sorted),
    minimising the sum over calls of call_cost + rows x longest row."""
    call_cost = CALL_COST_TOKENS if call_cost is None else call_cost
    if not lengths:
        return []
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    keys = [lengths[i] for i in order]
    if len(set(keys)) > MAX_DISTINCT_LENGTHS:
        step = -(-keys[-1] // MAX_DISTINCT_LENGTHS)
        keys = [-(-k // step) * step for k in keys]
    # cut points only where the length changes: rows of equal length always share a call
    cuts = [0] + [j for j in range(1, len(keys)) if keys[j] != keys[j - 1]] + [len(keys)]
    best = [0.0] + [float("inf")] * (len(cuts) - 1)
    back = [0] * len(cuts)
    for b in range(1, len(cuts)):
        end, longest = cuts[b], keys[cuts[b] - 1]
        for a in range(b):
            cost = best[a] + call_cost + (end - cuts[a]) * longest
            if cost < best[b]:
                best[b], back[b] = cost, a
    buckets, b = [], len(cuts) - 1
    while b > 0:
        a = back[b]
        buckets.append(order[cuts[a]:cuts[b]])
        b = a
    return buckets[::-1]


def padded_cost(lengths: list[int], call_cost: int | None = None) -> int:
    """The cost of one forward over `lengths` padded to the longest, in padded tokens."""
    call_cost = CALL_COST_TOKENS if call_cost is None else call_cost
    return call_cost + len(lengths) * max(lengths) if lengths else 0


@torch.no_grad()
def prefill_states(model, contexts: list[list[int]], pad_id: int, version: int,
                   fingerprint: ModelFingerprint) -> list[SequenceKV]:
    """The KV state of each context, computed in length buckets (plan_buckets)."""
    from relayrl.generation import left_pad

    states: list[SequenceKV | None] = [None] * len(contexts)
    for bucket in plan_buckets([len(c) for c in contexts]):
        ids, mask = left_pad([contexts[i] for i in bucket], pad_id)
        out = model(input_ids=ids, attention_mask=mask,
                    position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=True)
        split = kv_state.split(out.past_key_values, mask, [contexts[i] for i in bucket],
                               version, fingerprint)
        for i, state in zip(bucket, split, strict=True):
            states[i] = state
    assert all(s is not None for s in states)
    return states  # type: ignore[return-value]
