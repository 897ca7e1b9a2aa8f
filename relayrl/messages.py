"""The records that flow through the buffer: samples, groups and batches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from relayrl.codec import CodecError, decode_array, encode_array, pack, unpack

LOGPROB_TOLERANCE = 1e-4


def is_stale(oldest_version: int, version: int, max_staleness: int) -> bool:
    """The staleness rule, the trainer's and Submit's alike: tokens whose oldest version lags
    `version` by more than `max_staleness` (trainer.max_staleness) are not trained on."""
    return version - oldest_version > max_staleness


@dataclass
class Sample:
    """One completion of one prompt, with what the trainer needs to correct for staleness."""

    prompt_id: int
    lease_id: str
    worker_id: str
    prompt_tokens: np.ndarray  # int32 [P]
    response_tokens: np.ndarray  # int32 [R]
    logprobs: np.ndarray  # float32 [R], log-probability under the sampling policy
    versions: np.ndarray  # int64 [R], policy version that produced each token
    reward: float
    finish_reason: str = "stop"
    reward_error: str = ""
    # uint8 [R]: 1 on tokens the policy produced, 0 on tokens a tool or environment inserted
    # into a multi-turn response; None means every response token is the policy's
    loss_mask: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.prompt_tokens = np.asarray(self.prompt_tokens, dtype=np.int32)
        self.response_tokens = np.asarray(self.response_tokens, dtype=np.int32)
        self.logprobs = np.asarray(self.logprobs, dtype=np.float32)
        self.versions = np.asarray(self.versions, dtype=np.int64)
        if self.loss_mask is not None:
            self.loss_mask = np.asarray(self.loss_mask, dtype=np.uint8)
        validate_sample(self)

    @property
    def policy_token_mask(self) -> np.ndarray:
        if self.loss_mask is None:
            return np.ones(len(self.response_tokens), dtype=bool)
        return self.loss_mask.astype(bool)

    @property
    def oldest_version(self) -> int:
        """The oldest version among the tokens the policy produced: what staleness is."""
        return int(self.versions[self.policy_token_mask].min())

    def to_wire(self) -> dict[str, Any]:
        return {
            "prompt_id": self.prompt_id,
            "lease_id": self.lease_id,
            "worker_id": self.worker_id,
            "prompt_tokens": encode_array(self.prompt_tokens),
            "response_tokens": encode_array(self.response_tokens),
            "logprobs": encode_array(self.logprobs),
            "versions": encode_array(self.versions),
            "reward": float(self.reward),
            "finish_reason": self.finish_reason,
            "reward_error": self.reward_error,
            **({} if self.loss_mask is None else {"loss_mask": encode_array(self.loss_mask)}),
        }

    @classmethod
    def from_wire(cls, obj: Any, where: str = "sample") -> Sample:
        if not isinstance(obj, dict):
            raise CodecError(f"{where}: expected a map")
        _require(obj, where, prompt_id=int, lease_id=str, worker_id=str, reward=(int, float),
                 finish_reason=str, reward_error=str)
        try:
            return cls(
                prompt_id=obj["prompt_id"],
                lease_id=obj["lease_id"],
                worker_id=obj["worker_id"],
                prompt_tokens=_ints(obj, "prompt_tokens", where, 2**31),
                response_tokens=_ints(obj, "response_tokens", where, 2**31),
                logprobs=_floats(obj, "logprobs", where),
                versions=_ints(obj, "versions", where, 2**63),
                reward=float(obj["reward"]),
                finish_reason=obj["finish_reason"],
                reward_error=obj["reward_error"],
                loss_mask=_ints(obj, "loss_mask", where, 2) if "loss_mask" in obj else None,
            )
        except CodecError as err:  # name the sample's place, e.g. batch.groups[2].samples[5]
            msg = str(err)
            if where != "sample" and msg.startswith("sample."):
                msg = where + msg[len("sample"):]
            raise CodecError(msg) from None


def _ints(obj: dict[str, Any], name: str, where: str, bound: int) -> np.ndarray:
    """An integer array, refused rather than cast when it holds floats or values that the
    field's type cannot hold (a float token id would silently become another token)."""
    arr = decode_array(obj.get(name), f"{where}.{name}")
    if arr.dtype.kind not in "iub":
        raise CodecError(f"{where}.{name}: expected integers, got {arr.dtype.name}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= bound):
        raise CodecError(f"{where}.{name}: values must be in [0, {bound})")
    return arr


def _floats(obj: dict[str, Any], name: str, where: str) -> np.ndarray:
    arr = decode_array(obj.get(name), f"{where}.{name}")
    if arr.dtype.kind != "f":
        raise CodecError(f"{where}.{name}: expected floats, got {arr.dtype.name}")
    return arr


def _require(obj: dict[str, Any], where: str, **types: Any) -> None:
    for name, typ in types.items():
        if name not in obj:
            raise CodecError(f"{where}.{name}: missing")
        value = obj[name]
        if isinstance(value, bool) or not isinstance(value, typ):
            raise CodecError(f"{where}.{name}: wrong type {type(value).__name__}")


def validate_sample(s: Sample) -> None:
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
    if s.finish_reason not in ("stop", "length"):
        raise CodecError(f"sample.finish_reason: {s.finish_reason!r} is not 'stop' or 'length'")


def encode_sample(s: Sample) -> bytes:
    return pack("sample", s.to_wire())


def decode_sample(payload: bytes) -> Sample:
    return Sample.from_wire(unpack(payload, "sample"))


@dataclass
class Group:
    """All samples of one prompt: the unit GRPO normalises advantages over."""

    prompt_id: int
    samples: list[Sample] = field(default_factory=list)

    @property
    def oldest_version(self) -> int:
        return min(s.oldest_version for s in self.samples)

    def is_stale(self, version: int, max_staleness: int) -> bool:
        return is_stale(self.oldest_version, version, max_staleness)


@dataclass
class Batch:
    batch_id: str
    groups: list[Group]

    @property
    def num_samples(self) -> int:
        return sum(len(g.samples) for g in self.groups)


def encode_batch(b: Batch) -> bytes:
    groups = [
        {"prompt_id": g.prompt_id, "samples": [s.to_wire() for s in g.samples]} for g in b.groups
    ]
    return pack("batch", {"batch_id": b.batch_id, "groups": groups})


def decode_batch(payload: bytes) -> Batch:
    obj = unpack(payload, "batch")
    _require(obj, "batch", batch_id=str, groups=list)
    groups = []
    for i, g in enumerate(obj["groups"]):
        where = f"batch.groups[{i}]"
        if not isinstance(g, dict):
            raise CodecError(f"{where}: expected a map")
        _require(g, where, prompt_id=int, samples=list)
        samples = [Sample.from_wire(s, f"{where}.samples[{j}]") for j, s in enumerate(g["samples"])]
        if any(s.prompt_id != g["prompt_id"] for s in samples):
            raise CodecError(f"{where}.samples: prompt_id differs from the group's")
        groups.append(Group(prompt_id=g["prompt_id"], samples=samples))
    return Batch(batch_id=obj["batch_id"], groups=groups)
