"""Batches the trainer cannot, or did not, train on: moved aside, never retried forever.

A batch entry already in Redis may be poison: it does not decode, or one of its groups does
not fit the model the trainer holds (a token id past the embedding, a sequence past the
context, a log-probability or reward that is not a finite float32). Such groups are
quarantined: the rest of the batch trains; the quarantined groups' prompts are finished as
dropped (never re-issued, and the audit's books still balance), and a record of each (the
reason, the prompt ids, the entry's payload) goes to the run's quarantine. A step whose loss
or gradient norm was not finite is recorded there too (trainer_svc.objective skips it).

The quarantine is two Redis keys (relayrl.contracts.keys): a hash from "entry id:kind" to a record,
which `relayrl audit` reports and which makes recording idempotent (a restart re-reads the
entries since its last checkpoint and meets the same batch again), and a stream holding the
newest records with their payloads, to inspect or replay (relayrl_ops.audit reads the
hash).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass

import msgpack
import numpy as np

from relayrl.config import ModelLimits
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.messages import Batch, Group
from relayrl_torch.models.routing import expert_count

log = logging.getLogger(__name__)

# Payloads kept in the stream (a batch can be megabytes); the hash keeps every record.
PAYLOADS_KEPT = 100
FLOAT32_MAX = float(np.finfo(np.float32).max)  # the loss runs in float32
PER_TOKEN = ("logprobs", "versions", "loss_mask")  # one value per response token

# HSETNX first: a record already there (the same entry met again) writes nothing more.
RECORD_SCRIPT = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[3], '*', 'entry', ARGV[1], 'record', ARGV[2],
           'payload', ARGV[4])
return 1
"""


def live_limits(model) -> ModelLimits:
    """The vocabulary and context of the model the trainer actually holds: its embedding's
    rows and its config's context length (0 where the config names none: not checked)."""
    vocab = model.get_input_embeddings().num_embeddings
    context = getattr(model.config, "max_position_embeddings", None)
    return ModelLimits(vocab, context if isinstance(context, int) else 0, "the trainer's model",
                       expert_count(model))


def group_problem(g: Group, limits: ModelLimits) -> str | None:
    """Why the model cannot train on group `g` (the field, the value, the limit), or None."""
    for j, s in enumerate(g.samples):
        where = f"prompt {g.prompt_id} samples[{j}]"
        # the samples were checked where they entered the run; these are what a writer
        # other than ours could break and the loss cannot run on
        n = len(s.response_tokens)
        for name in ("prompt_tokens", "response_tokens", "logprobs", "versions", "loss_mask"):
            arr = getattr(s, name)
            if arr is not None and (arr.ndim != 1 or (name in PER_TOKEN and len(arr) != n)):
                return f"{where}.{name}: shape {arr.shape} does not fit {n} response tokens"
        for name in ("prompt_tokens", "response_tokens"):
            ids = getattr(s, name)
            if ids.size and int(ids.max()) >= limits.vocab_size:
                return (f"{where}.{name}: token id {int(ids.max())} is past the vocabulary "
                        f"of {limits.source} ({limits.vocab_size} tokens)")
        length = len(s.prompt_tokens) + len(s.response_tokens)
        if limits.context_length and length > limits.context_length:
            return (f"{where}: prompt + response is {length} tokens, past the context length "
                    f"of {limits.source} ({limits.context_length})")
        if not np.isfinite(s.logprobs).all():
            return f"{where}.logprobs: not all finite"
        if s.routes is not None:
            layers, experts, top_k = limits.experts
            shape = (layers, length - 1, top_k)
            if s.routes.shape != shape:
                return (f"{where}.routes: shape {s.routes.shape} does not fit {limits.source} "
                        f"({shape}: expert layers, positions fed, top_k)")
            if s.routes.size and int(s.routes.max()) >= experts:
                return (f"{where}.routes: expert {int(s.routes.max())} is past the "
                        f"{experts} experts of {limits.source}")
        if not (math.isfinite(s.reward) and abs(s.reward) <= FLOAT32_MAX):
            return f"{where}.reward: {s.reward} is not a finite float32 (|r| <= {FLOAT32_MAX:g})"
    return None


@dataclass
class Screened:
    batch: Batch  # the groups the model can train on
    quarantined: list[Group]
    reasons: list[str]


def screen(batch: Batch, limits: ModelLimits) -> Screened:
    kept, bad, reasons = [], [], []
    for g in batch.groups:
        problem = group_problem(g, limits)
        if problem is None:
            kept.append(g)
        else:
            bad.append(g)
            reasons.append(problem)
    return Screened(Batch(batch.batch_id, kept), bad, reasons)


def salvage_prompt_ids(payload: bytes | None) -> list[int]:
    """The prompt ids an undecodable batch names, as far as they can be read: the groups'
    integer prompt_id fields. The caller keeps only ids the buffer recorded as batched."""
    try:
        obj = msgpack.unpackb(payload or b"", raw=False, strict_map_key=False)
        groups = obj.get("groups") if isinstance(obj, dict) else None
    except Exception:  # msgpack raises several unrelated types
        return []
    if not isinstance(groups, list):
        return []
    ids = [g.get("prompt_id") for g in groups if isinstance(g, dict)]
    return sorted({i for i in ids if type(i) is int and i >= 0})


class Quarantine:
    """The run's quarantine in Redis (see the module docstring). `write` runs a Redis write
    through outages and memory pressure; it must be idempotent, and recording is."""

    def __init__(self, r, keys: RunKeys, write):
        self.keys = keys
        self.write = write
        self._script = r.register_script(RECORD_SCRIPT)

    def record(self, entry_id: bytes, kind: str, reason: str, prompt_ids: list[int],
               step: int, batch_id: str = "", payload: bytes | None = None) -> bool:
        """Record one batch entry's `kind` of trouble (its poison groups, a non-finite step
        on the rest); False if it already was (met again after a restart)."""
        entry = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        rec = json.dumps({"entry": entry, "kind": kind, "reason": reason, "step": step,
                          "prompt_ids": sorted(prompt_ids), "batch_id": batch_id},
                         sort_keys=True)
        keys = [self.keys.quarantine_index, self.keys.quarantine]
        new = bool(self.write(lambda: self._script(
            keys=keys, args=[f"{entry}:{kind}", rec, PAYLOADS_KEPT, payload or b""])))
        if new:
            log.error("quarantined batch entry %s (%s, prompts %s): %s", entry, kind,
                      _few(prompt_ids), reason)
        return new


def _few(ids: list[int], most: int = 8) -> str:
    shown = ", ".join(map(str, ids[:most]))
    return f"[{shown}{', ...' if len(ids) > most else ''}]"
