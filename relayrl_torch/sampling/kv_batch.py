"""Batched caches from and to per-sequence KV states (relayrl_torch.sampling.kv_state).

`assemble` stacks states into one left-padded transformers cache for a batch that resumes
from them; `split` copies each row's real columns out of a batch's cache as a SequenceKV.
Only full-attention dynamic caches can be cut per sequence. Exercised by
tests/unit/test_kv_state.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from relayrl_torch.sampling.kv_state import DTYPES, ModelFingerprint, SequenceKV


@dataclass
class BatchedKV:
    """A left-padded batched cache: mask [B, width] marks real columns; next_positions [B]
    is each sequence's token count, the position of the token that follows."""

    cache: Any  # transformers DynamicCache
    mask: torch.Tensor
    next_positions: torch.Tensor


def assemble(states: list[SequenceKV | None], fingerprint: ModelFingerprint,
             device: torch.device | None = None) -> BatchedKV | None:
    """One cache for a batch on `device` (default the CPU), each state right-aligned (states
    may sit anywhere: an imported one is on the CPU); a None row is all padding. None when no
    row has a state."""
    from transformers import DynamicCache

    width = max((len(s) for s in states if s is not None), default=0)
    if width == 0:
        return None
    fp, batch = fingerprint, len(states)
    shape = (fp.num_layers, batch, fp.kv_heads, width, fp.head_dim)
    keys = torch.zeros(shape, dtype=DTYPES[fp.dtype], device=device)
    values = torch.zeros_like(keys)
    mask = torch.zeros((batch, width), dtype=torch.long)
    lengths = torch.zeros(batch, dtype=torch.long)
    for i, s in enumerate(states):
        if s is None:
            continue
        differences = s.fingerprint.differences(fp)
        if differences:
            raise ValueError(f"states[{i}]: computed by another model ({'; '.join(differences)})")
        keys[:, i, :, width - len(s):] = s.keys
        values[:, i, :, width - len(s):] = s.values
        mask[i, width - len(s):] = 1
        lengths[i] = len(s)
    cache = DynamicCache(ddp_cache_data=list(zip(keys, values, strict=True)))
    return BatchedKV(cache, mask.to(keys.device), lengths.to(keys.device))


def split(cache: Any, mask: torch.Tensor, covered: list[list[int]], version: int,
          fingerprint: ModelFingerprint) -> list[SequenceKV]:
    """Each row's real columns (mask == 1) of a batched cache, copied out; covered[i] are
    the tokens those columns hold, in order."""
    from transformers.cache_utils import DynamicLayer

    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise ValueError("kv state: only full-attention dynamic caches can be split")
    out = []
    for i, tokens in enumerate(covered):
        cols = mask[i].nonzero().squeeze(-1)
        assert len(cols) == len(tokens), (i, len(cols), len(tokens))
        keys = torch.stack([layer.keys[i].index_select(-2, cols) for layer in cache.layers])
        values = torch.stack([layer.values[i].index_select(-2, cols) for layer in cache.layers])
        out.append(SequenceKV(tuple(tokens), version, fingerprint, keys, values))
    return out
