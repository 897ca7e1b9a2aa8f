"""The records that flow through the buffer: samples, groups and batches.

Each is a typed wire struct (relayrl.contracts.codec.Wire), declared once here and encoded and
decoded by its type: a group is one entry of the trajectory stream, a batch one of the batch stream.
Decoding checks types (an integer array holds integers its dtype can hold, a finish reason is
a FinishReason); whether a sample makes sense (`validate_sample`) is checked once, where it
enters the run: the rollout worker's delivery and Buffer.Submit.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

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
    # uint8 (int16 past 256 experts) [moe layers, P + R - 1, top_k]: the experts the engine
    # routed each fed position to (the prompt and the response but its last token), for the
    # trainer's routing replay (relayrl_torch.models.routing); None: the trainer routes itself
    routes: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.prompt_tokens = _array(self.prompt_tokens, np.int32, "prompt_tokens", 2**31)
        self.response_tokens = _array(self.response_tokens, np.int32, "response_tokens", 2**31)
        self.logprobs = _array(self.logprobs, np.float32, "logprobs")
        self.versions = _array(self.versions, np.int64, "versions", 2**63)
        if self.loss_mask is not None:
            self.loss_mask = _array(self.loss_mask, np.uint8, "loss_mask", 2)
        if self.routes is not None:
            self.routes = _routes(self.routes)
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
    """`value` as an array of `dtype`. Integers are checked inside [0, bound) before the cast
    (a cast would wrap: 257 into a uint8 mask is 1). A caller's sequence of floats is
    converted; an array (what the wire decodes to) is refused rather than cast when it holds
    another kind of number (a float token id would silently become another token)."""
    if bound is None and not isinstance(value, np.ndarray):
        return np.asarray(value, dtype=dtype)
    arr = np.asarray(value)
    if arr.size == 0 and not isinstance(value, np.ndarray):
        return arr.astype(dtype)  # an empty sequence has no kind of number
    if bound is None and arr.dtype.kind != "f":
        raise CodecError(f"sample.{name}: expected floats, got {arr.dtype.name}")
    if bound is not None:
        if arr.dtype.kind not in "iub":
            raise CodecError(f"sample.{name}: expected integers, got {arr.dtype.name}")
        bad = np.flatnonzero((arr < 0) | (arr > bound - 1))
        if bad.size:
            j, v = int(bad[0]), int(arr.flat[bad[0]])
            raise CodecError(f"sample.{name}[{j}]: {v} is " + ("below 0" if v < 0 else
                                                               f"outside [0, {bound})"))
    return arr.astype(dtype, copy=False)


def _routes(value) -> np.ndarray | None:
    """Routes as a [layers, tokens, top_k] array of expert indices (uint8 when they fit, else
    int16), from an array or from the wire's ExpertRoutes (layers, top_k, the experts
    flattened; none given: None)."""
    if hasattr(value, "experts"):  # relayrl.v1.ExpertRoutes
        if not value.experts:
            return None
        flat = np.asarray(value.experts, dtype=np.int64)
        if value.layers < 1 or value.top_k < 1 or flat.size % (value.layers * value.top_k):
            raise CodecError(f"sample.routes: {flat.size} experts do not make [layers "
                             f"{value.layers}, tokens, top_k {value.top_k}]")
        value = flat.reshape(value.layers, -1, value.top_k)
    arr = _array(value, np.int16, "routes", 2**15)
    if arr.ndim != 3:
        raise CodecError(f"sample.routes: must be [layers, tokens, top_k], got {arr.ndim} "
                         "dimensions")
    return arr.astype(np.uint8) if arr.size == 0 or arr.max() < 256 else arr


@dataclass(frozen=True)
class SampleLimits:
    """The run's bounds on a sample made outside it (Buffer.Submit): the model's vocabulary
    and context, the task's reward range (task.reward_range), and the trainer's latest
    version."""

    vocab_size: int
    context_length: int
    model: str  # where the model's limits come from, for the messages
    reward_range: tuple[float, float]
    latest_version: int
    # the model's mixture of experts: (moe layers, experts, top_k); (0, 0, 0): dense
    experts: tuple[int, int, int] = (0, 0, 0)


def validate_sample(s: Sample, limits: SampleLimits | None = None) -> None:
    """Whether `s` makes sense, and with `limits` whether it fits the run; checked once,
    where a sample enters the run. A CodecError names the field, the value and the limit."""
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
    if limits is not None:
        _check_tokens(s, limits)
    if s.loss_mask is not None:
        if s.loss_mask.ndim != 1 or len(s.loss_mask) != n:
            raise CodecError(f"sample.loss_mask: {s.loss_mask.size} values for {n} response "
                             "tokens")
        if not s.loss_mask.any():
            raise CodecError("sample.loss_mask: no token is the policy's (all zero)")
    # a log-probability above 0 is no probability; the tolerance admits an engine's rounding
    bad = ~np.isfinite(s.logprobs) | (s.policy_token_mask & (s.logprobs > LOGPROB_TOLERANCE))
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise CodecError(f"sample.logprobs[{j}]: {float(s.logprobs[j])!r} is not a finite "
                         f"log-probability <= 0 (tolerance {LOGPROB_TOLERANCE:g})")
    if s.routes is not None:
        _check_routes(s, limits)
    if limits is not None and np.any(s.versions > limits.latest_version):
        j = int(np.argmax(s.versions))
        raise CodecError(f"sample.versions[{j}]: version {int(s.versions[j])} is newer than "
                         f"the latest policy version ({limits.latest_version})")
    if limits is not None:
        low, high = limits.reward_range
        if not low <= s.reward <= high:  # NaN fails this too
            raise CodecError(f"sample.reward: {s.reward!r} is outside task.reward_range "
                             f"[{low:g}, {high:g}]")
    elif not np.isfinite(s.reward):
        raise CodecError(f"sample.reward: {s.reward!r} is not finite")


def _check_routes(s: Sample, limits: SampleLimits | None) -> None:
    """Routes cover every fed position, and with `limits` fit the model's experts."""
    fed = len(s.prompt_tokens) + len(s.response_tokens) - 1
    layers, tokens, top_k = s.routes.shape
    if tokens != fed:
        raise CodecError(f"sample.routes: {tokens} positions for {fed} fed tokens (the prompt "
                         "and the response but its last)")
    if limits is None:
        return
    moe_layers, experts, experts_per_token = limits.experts
    if not experts:
        raise CodecError(f"sample.routes: the model ({limits.model}) has no mixture of "
                         "experts to route")
    if (layers, top_k) != (moe_layers, experts_per_token):
        raise CodecError(f"sample.routes: [{layers}, {tokens}, {top_k}] for a model of "
                         f"{moe_layers} expert layers, top_k {experts_per_token} "
                         f"({limits.model})")
    if s.routes.size and int(s.routes.max()) >= experts:
        where = np.unravel_index(int(np.argmax(s.routes)), s.routes.shape)
        raise CodecError(f"sample.routes[{', '.join(map(str, where))}]: expert "
                         f"{int(s.routes[where])} is outside [0, {experts}) ({limits.model})")


def _check_tokens(s: Sample, limits: SampleLimits) -> None:
    """The sequence inside the model's context, then (scanning costs more) every token id
    inside its vocabulary."""
    p, r = len(s.prompt_tokens), len(s.response_tokens)
    if p + r > limits.context_length:
        raise CodecError(f"sample: prompt_tokens ({p}) + response_tokens ({r}) = {p + r} "
                         f"tokens, over the model's context length {limits.context_length} "
                         f"({limits.model})")
    for name in ("prompt_tokens", "response_tokens"):
        ids = getattr(s, name)
        bad = np.flatnonzero((ids < 0) | (ids >= limits.vocab_size))
        if bad.size:
            j = int(bad[0])
            raise CodecError(f"sample.{name}[{j}]: token id {int(ids[j])} is outside the "
                             f"model's vocabulary [0, {limits.vocab_size}) ({limits.model})")


class Group(Wire, tag="group"):
    """All samples of one prompt: the unit GRPO normalises advantages over, and one entry of
    the trajectory stream (a producer appends a group whole). `source` names who produced an
    external group (Buffer.Submit's SubmitRequest.source), once for all its samples."""

    prompt_id: int
    samples: list[Sample] = msgspec.field(default_factory=list)
    source: str = ""

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
