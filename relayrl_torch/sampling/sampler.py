"""Batched sampling with a KV cache that records each token's log-probability.

Prompts are left-padded and given explicit position ids, so a sequence's positions do not
depend on what it is batched with; the trainer's recomputation sees the same positions.
`sample_with_kv` can also start a sequence from a KV state kept from an earlier call (see
relayrl_torch/sampling/kv_state.py) and hand back each sequence's final state.

Everything runs on the model's device. Tokens are drawn on the generator's device: a caller
that passes a CPU generator for a GPU model (the evals, seeded alike on any machine) pays one
small copy of the probabilities per step; the torch engine keeps its generator on its device.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from relayrl_torch.devices import model_device
from relayrl_torch.models.routing import RouteRecorder
from relayrl_torch.sampling import kv_batch, prefill
from relayrl_torch.sampling.kv_state import ModelFingerprint, SequenceKV
from relayrl_torch.sampling.prefill import left_pad


class Stopped(Exception):
    """Sampling was told to stop (its `stop` event set) before it finished."""


@dataclass
class Completion:
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (emitted eos, or a stop string) or "length"
    stop_reason: str | None = None  # the stop string that ended it (None: eos or length)
    # each position's most likely tokens, most likely first: (token, logprob), when asked
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # each fed position's experts, [moe layers, context + tokens - 1, top_k], when recorded
    # (relayrl_torch.models.routing): the context and every token but the last, never fed
    routes: np.ndarray | None = None


@torch.no_grad()
def sample(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int,
    temperature: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    stop: threading.Event | None = None,
) -> list[Completion]:
    """Up to max_new_tokens tokens after each prompt, ending a sequence at any of `eos_ids`
    (none: at the budget only); Stopped, between two tokens, once `stop` is set."""
    completions, _ = sample_with_kv(
        model, prompts, max_new_tokens=max_new_tokens, eos_ids=eos_ids, pad_id=pad_id,
        temperature=temperature, greedy=greedy, generator=generator, stop=stop)
    return completions


@torch.no_grad()
def sample_with_kv(
    model,
    contexts: list[list[int]],
    *,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int,
    temperature: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    states: list[SequenceKV | None] | None = None,
    return_states: bool = False,
    version: int = 0,
    stop: threading.Event | None = None,
    top_logprobs: int = 0,
    ends: Callable[[list[int]], bool] | None = None,
    recorder: RouteRecorder | None = None,
) -> tuple[list[Completion], list[SequenceKV] | None]:
    """`sample`, resuming each context from its KV state where one is given (it must cover a
    prefix of the context; the rest is fed with the first step) and, with return_states,
    returning every sequence's final state (tagged `version`): it covers the context and all
    generated tokens but the last, which was sampled but never fed. `top_logprobs` > 0 also
    records each position's most likely tokens; `ends(tokens)`, asked after every token of
    a sequence not yet finished, ends it there when true (a stop string). `recorder` records
    every fed position's experts (Completion.routes): every context is then fed whole, as a
    kept state or a bucketed prefill would leave positions it never saw."""
    if recorder is not None and any(s is not None for s in states or []):
        raise ValueError("states: recording routes feeds every context whole")
    if not contexts or any(len(c) == 0 for c in contexts):
        raise ValueError("prompts: every prompt needs at least one token")
    if states is not None and len(states) != len(contexts):
        raise ValueError(f"states: {len(states)} for {len(contexts)} contexts")
    batch = len(contexts)
    prefixes = [_usable_prefix(i, c, s) for i, (c, s) in
                enumerate(zip(contexts, states or [None] * batch, strict=True))]
    fingerprint = (ModelFingerprint.of(model)
                   if return_states or any(s is not None for s in states or []) else None)
    if recorder is None:
        prefixes, fingerprint = _prefill_in_buckets(model, contexts, prefixes, pad_id,
                                                    version, fingerprint)
    device = model_device(model)
    past, mask, step_ids, step_pos = _first_step(contexts, prefixes, pad_id, fingerprint,
                                                 device)

    out_tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    out_logprobs = torch.zeros((batch, max_new_tokens), device=device)
    lengths = torch.full((batch,), max_new_tokens, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    eos = torch.tensor(list(eos_ids), dtype=torch.long, device=device)
    top: list[torch.Tensor] = []  # [batch, 2, k] per step: ids, logprobs
    made: list[list[int]] = [[] for _ in range(batch)] if ends is not None else []
    # a group's samples share their prompt: with no state to resume, prefill each distinct
    # context once and select its cache into its rows
    shared = _distinct_rows(contexts) if past is None else None
    for t in range(max_new_tokens):
        if stop is not None and stop.is_set():
            raise Stopped(f"stopped after {t} of up to {max_new_tokens} tokens")
        if t == 0 and shared is not None:
            first, inverse = (t.to(device) for t in shared)
            out = model(input_ids=step_ids[first], attention_mask=mask[first],
                        position_ids=step_pos[first], use_cache=True, logits_to_keep=1)
            past = out.past_key_values
            past.batch_select_indices(inverse)
            logits = out.logits[inverse, -1, :]
            if recorder is not None:
                recorder.step(mask[first].bool(), rows=inverse)
        else:
            # the next token's logits only: a prefill or a tool result fed at once would
            # otherwise make [rows, tokens, vocabulary] (5 GB for 64 rows of 400 SmolLM2
            # tokens)
            out = model(
                input_ids=step_ids, attention_mask=mask, position_ids=step_pos,
                past_key_values=past, use_cache=True, logits_to_keep=1,
            )
            past = out.past_key_values
            logits = out.logits[:, -1, :]
            if recorder is not None:
                recorder.step(mask[:, -step_ids.shape[1]:].bool())
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        if greedy:
            tok = logp.argmax(-1)
        else:
            tok = _draw(logp, generator)
        tok = torch.where(finished, torch.full_like(tok, pad_id), tok)
        out_tokens[:, t] = tok
        out_logprobs[:, t] = logp.gather(-1, tok[:, None]).squeeze(-1)
        if top_logprobs:
            best = logp.topk(top_logprobs, dim=-1)
            top.append(torch.stack([best.indices.to(logp.dtype), best.values], dim=1))
        newly_done = (~finished) & torch.isin(tok, eos)
        if ends is not None:  # one copy of the step's tokens to the host: only when asked
            hit = []
            for i, (token, done) in enumerate(zip(tok.tolist(), finished.tolist(),
                                                  strict=True)):
                if not done:
                    made[i].append(token)
                    hit.append(ends(made[i]))
                else:
                    hit.append(False)
            newly_done |= torch.tensor(hit, dtype=torch.bool, device=device)
        lengths[newly_done] = t + 1
        finished |= newly_done
        if bool(finished.all()) or t == max_new_tokens - 1:
            break
        step_ids = tok[:, None]
        step_pos = step_pos[:, -1:] + 1
        # A finished row's padding is masked out, so its cache stays exactly its real tokens.
        mask = torch.cat([mask, (~finished).long()[:, None]], dim=-1)

    out_tokens, out_logprobs = out_tokens.cpu(), out_logprobs.cpu()
    lengths, finished = lengths.cpu(), finished.cpu()
    tops = torch.stack(top, dim=1).cpu() if top else None  # [batch, steps, 2, k]
    routes = recorder.routes() if recorder is not None else None
    results = []
    for i in range(batch):
        n = int(lengths[i])
        if routes is not None:
            assert routes[i].shape[1] == len(contexts[i]) + n - 1, (routes[i].shape, n)
        results.append(
            Completion(
                tokens=out_tokens[i, :n].tolist(),
                logprobs=out_logprobs[i, :n].tolist(),
                finish_reason="stop" if bool(finished[i]) and n <= max_new_tokens else "length",
                top_logprobs=None if tops is None else [
                    [(int(a), float(b)) for a, b in zip(*tops[i, s].tolist(), strict=True)]
                    for s in range(n)],
                routes=None if routes is None else routes[i],
            )
        )
    if not return_states:
        return results, None
    covered = [list(c) + r.tokens[:-1] for c, r in zip(contexts, results, strict=True)]
    return results, kv_batch.split(past, mask, covered, version, fingerprint)


def _distinct_rows(contexts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(the first row of each distinct context, each row's index into those), or None when
    every context differs."""
    index: dict[tuple[int, ...], int] = {}
    inverse = [index.setdefault(tuple(c), len(index)) for c in contexts]
    if len(index) == len(contexts):
        return None
    first = [0] * len(index)
    for row in reversed(range(len(contexts))):
        first[inverse[row]] = row
    return torch.tensor(first), torch.tensor(inverse)


def _prefill_in_buckets(model, contexts: list[list[int]], prefixes: list[SequenceKV | None],
                        pad_id: int, version: int, fingerprint: ModelFingerprint | None
                        ) -> tuple[list[SequenceKV | None], ModelFingerprint | None]:
    """(prefixes, fingerprint) with states for the rows the first forward would feed more
    than one token, computed in length buckets (relayrl_torch.sampling.prefill) when that is
    cheaper than padding them all to the longest; every such row is then fed only its last
    token."""
    fed = [len(c) - (len(p) if p is not None else 0) for c, p in zip(contexts, prefixes,
                                                                      strict=True)]
    rows = [i for i, (p, n) in enumerate(zip(prefixes, fed, strict=True)) if p is None and n > 1]
    covered = [contexts[i][:-1] for i in rows]
    if len(rows) < 2 or not prefill.worth_bucketing(fed, rows, [len(c) for c in covered]):
        return prefixes, fingerprint
    try:
        fingerprint = fingerprint or ModelFingerprint.of(model)
        new = prefill.prefill_states(model, covered, pad_id, version, fingerprint)
    except ValueError:  # a cache that cannot be cut per sequence (sliding window, ...)
        return prefixes, fingerprint
    merged = list(prefixes)
    for i, state in zip(rows, new, strict=True):
        merged[i] = state
    return merged, fingerprint


def _draw(logp: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from the distributions exp(logp), on logp's device."""
    probs = logp.exp()
    if generator is not None and generator.device != probs.device:
        return torch.multinomial(probs.to(generator.device), 1, generator=generator
                                 ).squeeze(-1).to(probs.device)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _first_step(contexts: list[list[int]], prefixes: list[SequenceKV | None], pad_id: int,
                fingerprint: ModelFingerprint | None, device: torch.device):
    """The cache, mask, ids and positions of the first forward: each context's usable state
    (_usable_prefix) as the cache and the tokens it does not cover as input. Rows are
    right-aligned in both, so a row with a short suffix has a masked gap between its cached
    and its new tokens."""
    batched = (kv_batch.assemble(prefixes, fingerprint, device) if fingerprint is not None
               else None)
    suffixes = [c[len(s):] if s is not None else c for c, s in zip(contexts, prefixes, strict=True)]
    ids, suffix_mask = left_pad(suffixes, pad_id, device)
    if batched is None:
        return None, suffix_mask, ids, (suffix_mask.cumsum(-1) - 1).clamp(min=0)
    positions = (batched.next_positions[:, None] + suffix_mask.cumsum(-1) - 1).clamp(min=0)
    return batched.cache, torch.cat([batched.mask, suffix_mask], dim=-1), ids, positions


def _usable_prefix(i: int, context: list[int], state: SequenceKV | None) -> SequenceKV | None:
    """The state cut to leave at least the last context token to feed (its logits give the
    next token)."""
    if state is None:
        return None
    if len(state) > len(context) or state.tokens != tuple(context[:len(state)]):
        raise ValueError(f"states[{i}]: its {len(state)} tokens are not a prefix of "
                         f"contexts[{i}] ({len(context)} tokens)")
    if len(state) < len(context):
        return state
    return state.prefix(len(context) - 1) if len(context) > 1 else None
