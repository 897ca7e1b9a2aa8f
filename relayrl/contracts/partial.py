"""The token state of a group still being generated: what a partial rollout carries across
segments, and what a worker hands back to the scheduler so another can resume it.

Each sequence keeps, per token, the log-probability it was sampled with and the policy
version that sampled it, so a resumed sequence is trained exactly as if it had never moved;
and, from a mixture of experts whose engine records them, the experts its latest engine call
routed every fed position to (relayrl.contracts.messages.Sample.routes).
Both are wire structs (relayrl.contracts.codec.Wire), encoded and decoded by their types.
"""

from __future__ import annotations

import msgspec
import numpy as np

from relayrl.contracts.codec import CodecError, Wire, decode, encode
from relayrl.contracts.messages import FinishReason


class PartialSequence(msgspec.Struct):
    tokens: list[int] = msgspec.field(default_factory=list)
    logprobs: list[float] = msgspec.field(default_factory=list)
    versions: list[int] = msgspec.field(default_factory=list)
    finish_reason: FinishReason | None = None  # None: still generating
    # [moe layers, prompt + tokens - 1, top_k], as Sample.routes; None: not recorded
    routes: np.ndarray | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def extend(self, tokens: list[int], logprobs: list[float], version: int,
               routes: np.ndarray | None = None) -> None:
        """`routes`: the sequence's own once extended (its prompt and tokens but the last),
        or None, which forgets any: positions the engine did not route."""
        if len(tokens) != len(logprobs):
            raise ValueError(f"extend: {len(tokens)} tokens but {len(logprobs)} logprobs")
        self.tokens.extend(tokens)
        self.logprobs.extend(logprobs)
        self.versions.extend([version] * len(tokens))
        self.routes = routes


class PartialGroup(Wire, tag="partial_group"):
    prompt_id: int
    prompt_tokens: list[int]
    sequences: list[PartialSequence]

    @classmethod
    def fresh(cls, prompt_id: int, prompt_tokens: list[int], n: int) -> PartialGroup:
        return cls(prompt_id, list(prompt_tokens), [PartialSequence() for _ in range(n)])

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.sequences)

    def unfinished(self) -> list[PartialSequence]:
        return [s for s in self.sequences if not s.finished]

    def encode(self) -> bytes:
        return encode(self)

    @classmethod
    def decode(cls, payload: bytes, prompt_id: int, n: int) -> PartialGroup:
        """Decode and check it belongs to `prompt_id` and holds `n` sequences."""
        group = decode(payload, cls)
        if group.prompt_id != prompt_id:
            raise CodecError(f"partial_group.prompt_id: {group.prompt_id!r}, expected {prompt_id}")
        if len(group.sequences) != n:
            raise CodecError(f"partial_group.sequences: expected a list of {n}")
        for i, s in enumerate(group.sequences):
            if not len(s.tokens) == len(s.logprobs) == len(s.versions):
                raise CodecError(f"partial_group.sequences[{i}]: tokens, logprobs and versions "
                                 "differ in length")
        return group
