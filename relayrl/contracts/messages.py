"""The records that flow through the buffer: samples, groups and batches.

Each is a typed wire struct (relayrl.contracts.codec.Wire), declared once here and encoded and
decoded by its type: a group is one entry of the trajectory stream, a batch one of the batch stream.
Decoding checks types (an integer array holds integers its dtype can hold, a finish reason is
a FinishReason); whether a sample makes sense (`validate_sample`) is checked once, where it
enters the run: the rollout worker's delivery and Buffer.Submit.
"""

from __future__ import annotations

import enum

import msgspec
import numpy as np

from relayrl.contracts.codec import CodecError, Wire, decode, encode
from relayrl.rules.staleness import is_stale

LOGPROB_TOLERANCE = 1e-4


class FinishReason(str, enum.Enum):  # enum.StrEnum once Python 3.10 is dropped
    STOP = "stop"  # the engine emitted end-of-sequence
    LENGTH = "length"  # the token budget ran out


class Sample(Wire, tag="sample"):
    """One completion of one prompt, with what the trainer needs to correct for staleness."""

    prompt_id: int
    lease_id: str
    worker_id: str
    prompt_tokens: np.ndarray  # int32 [P]
    response_tokens: np.ndarray  # int32 [R]
    logprobs: np.ndarray  # float32 [R], log-probability under the sampling policy
    versions: np.ndarray  # int64 [R], policy version that produced each token
    reward: float
    finish_reason: FinishReason = FinishReason.STOP
    reward_error: str = ""
    # uint8 [R]: 1 on tokens the policy produced, 0 on tokens a tool or environment inserted
    # into a multi-turn response; None means every response token is the policy's
    loss_mask: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.prompt_tokens = _array(self.prompt_tokens, np.int32, "prompt_tokens", 2**31)
        self.response_tokens = _array(self.response_tokens, np.int32, "response_tokens", 2**31)
        self.logprobs = _array(self.logprobs, np.float32, "logprobs")
        self.versions = _array(self.versions, np.int64, "versions", 2**63)
        if self.loss_mask is not None:
            self.loss_mask = _array(self.loss_mask, np.uint8, "loss_mask", 2)
        self.reward = float(self.reward)
        try:
            self.finish_reason = FinishReason(self.finish_reason)
        except ValueError:
            raise CodecError(f"sample.finish_reason: {self.finish_reason!r} is not 'stop' or "
                             "'length'") from None

    @property
    def policy_token_mask(self) -> np.ndarray:
        if self.loss_mask is None:
            return np.ones(len(self.response_tokens), dtype=bool)
        return self.loss_mask.astype(bool)

    @property
    def oldest_version(self) -> int:
        """The oldest version among the tokens the policy produced: what staleness is."""
        return int(self.versions[self.policy_token_mask].min())


def _array(value, dtype, name: str, bound: int | None = None) -> np.ndarray:
    """`value` as an array of `dtype`. A caller's lists are converted; an array (what the
    wire decodes to) is refused rather than cast when it holds another kind of number, or
    integers the dtype cannot hold (a float token id would silently become another token)."""
    if not isinstance(value, np.ndarray):
        return np.asarray(value, dtype=dtype)
    if bound is None and value.dtype.kind != "f":
        raise CodecError(f"sample.{name}: expected floats, got {value.dtype.name}")
    if bound is not None:
        if value.dtype.kind not in "iub":
            raise CodecError(f"sample.{name}: expected integers, got {value.dtype.name}")
        if value.size and (int(value.min()) < 0 or int(value.max()) >= bound):
            raise CodecError(f"sample.{name}: values must be in [0, {bound})")
    return value.astype(dtype, copy=False)


def validate_sample(s: Sample) -> None:
    """Whether `s` makes sense; checked once, where a sample enters the run."""
    if s.prompt_id < 0:
        raise CodecError(f"sample.prompt_id: must be >= 0, got {s.prompt_id}")
    for name in ("prompt_tokens", "response_tokens", "logprobs", "versions"):
        if getattr(s, name).ndim != 1:
            raise CodecError(f"sample.{name}: must be one-dimensional")
    n = len(s.response_tokens)
    if n == 0:
        raise CodecError("sample.response_tokens: must hold at least one token")
    if len(s.prompt_tokens) == 0:
        raise CodecError("sample.prompt_tokens: must hold at least one token")
    if len(s.logprobs) != n:
        raise CodecError(f"sample.logprobs: {len(s.logprobs)} values for {n} response tokens")
    if len(s.versions) != n:
        raise CodecError(f"sample.versions: {len(s.versions)} values for {n} response tokens")
    if s.loss_mask is not None:
        if s.loss_mask.ndim != 1 or len(s.loss_mask) != n:
            raise CodecError(f"sample.loss_mask: {s.loss_mask.size} values for {n} response "
                             "tokens")
        if np.any(s.loss_mask > 1):
            raise CodecError("sample.loss_mask: values must be 0 or 1")
        if not s.loss_mask.any():
            raise CodecError("sample.loss_mask: no token is the policy's (all zero)")
    # a log-probability above 0 is no probability; the tolerance admits an engine's rounding
    bad = ~np.isfinite(s.logprobs) | (s.policy_token_mask & (s.logprobs > LOGPROB_TOLERANCE))
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise CodecError(f"sample.logprobs[{j}]: {float(s.logprobs[j])!r} is not a finite "
                         f"log-probability <= 0 (tolerance {LOGPROB_TOLERANCE:g})")
    if np.any(s.versions < 0):
        j = int(np.flatnonzero(s.versions < 0)[0])
        raise CodecError(f"sample.versions[{j}]: {int(s.versions[j])} is below 0")
    if not np.isfinite(s.reward):
        raise CodecError(f"sample.reward: {s.reward!r} is not finite")


class Group(Wire, tag="group"):
    """All samples of one prompt: the unit GRPO normalises advantages over, and one entry of
    the trajectory stream (a producer appends a group whole)."""

    prompt_id: int
    samples: list[Sample] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if any(s.prompt_id != self.prompt_id for s in self.samples):
            raise CodecError("group.samples: prompt_id differs from the group's")

    @property
    def oldest_version(self) -> int:
        return min(s.oldest_version for s in self.samples)

    def is_stale(self, version: int, max_staleness: int) -> bool:
        return is_stale(self.oldest_version, version, max_staleness)


class Batch(Wire, tag="batch"):
    batch_id: str
    groups: list[Group]


def encode_group(g: Group) -> bytes:
    return encode(g)


def decode_group(payload: bytes) -> Group:
    return decode(payload, Group)


def encode_batch(b: Batch) -> bytes:
    return encode(b)


def decode_batch(payload: bytes) -> Batch:
    return decode(payload, Batch)
