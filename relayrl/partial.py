"""The token state of a group still being generated: what a partial rollout carries across
segments, and what a worker hands back to the scheduler so another can resume it.

Each sequence keeps, per token, the log-probability it was sampled with and the policy
version that sampled it, so a resumed sequence is trained exactly as if it had never moved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from relayrl.codec import CodecError, decode_array, encode_array, pack, unpack

FINISH_REASONS = ("", "stop", "length")  # "" = still generating


@dataclass
class PartialSequence:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str = ""

    @property
    def finished(self) -> bool:
        return self.finish_reason != ""

    def extend(self, tokens: list[int], logprobs: list[float], version: int) -> None:
        if len(tokens) != len(logprobs):
            raise ValueError(f"extend: {len(tokens)} tokens but {len(logprobs)} logprobs")
        self.tokens.extend(tokens)
        self.logprobs.extend(logprobs)
        self.versions.extend([version] * len(tokens))


@dataclass
class PartialGroup:
    prompt_id: int
    prompt_tokens: list[int]
    sequences: list[PartialSequence]

    @classmethod
    def fresh(cls, prompt_id: int, prompt_tokens: list[int], n: int) -> PartialGroup:
        return cls(prompt_id, list(prompt_tokens), [PartialSequence() for _ in range(n)])

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.sequences)

    @property
    def tokens_generated(self) -> int:
        return sum(len(s.tokens) for s in self.sequences)

    def unfinished(self) -> list[PartialSequence]:
        return [s for s in self.sequences if not s.finished]

    def encode(self) -> bytes:
        seqs = [{"tokens": encode_array(np.asarray(s.tokens, dtype=np.int32)),
                 "logprobs": encode_array(np.asarray(s.logprobs, dtype=np.float32)),
                 "versions": encode_array(np.asarray(s.versions, dtype=np.int64)),
                 "finish_reason": s.finish_reason} for s in self.sequences]
        return pack("partial_group", {
            "prompt_id": self.prompt_id,
            "prompt_tokens": encode_array(np.asarray(self.prompt_tokens, dtype=np.int32)),
            "sequences": seqs})

    @classmethod
    def decode(cls, payload: bytes, prompt_id: int, n: int) -> PartialGroup:
        """Decode and check it belongs to `prompt_id` and holds `n` sequences."""
        obj = unpack(payload, "partial_group")
        if obj.get("prompt_id") != prompt_id:
            raise CodecError(f"partial_group.prompt_id: {obj.get('prompt_id')!r}, "
                             f"expected {prompt_id}")
        seqs = obj.get("sequences")
        if not isinstance(seqs, list) or len(seqs) != n:
            raise CodecError(f"partial_group.sequences: expected a list of {n}")
        prompt = decode_array(obj.get("prompt_tokens"), "partial_group.prompt_tokens")
        out = []
        for i, s in enumerate(seqs):
            where = f"partial_group.sequences[{i}]"
            if not isinstance(s, dict) or s.get("finish_reason") not in FINISH_REASONS:
                raise CodecError(f"{where}.finish_reason: expected one of {FINISH_REASONS}")
            arrays = [decode_array(s.get(k), f"{where}.{k}")
                      for k in ("tokens", "logprobs", "versions")]
            if len({len(a) for a in arrays}) != 1:
                raise CodecError(f"{where}: tokens, logprobs and versions differ in length")
            out.append(PartialSequence(arrays[0].tolist(), arrays[1].tolist(),
                                       arrays[2].tolist(), s["finish_reason"]))
        return cls(prompt_id, prompt.tolist(), out)
