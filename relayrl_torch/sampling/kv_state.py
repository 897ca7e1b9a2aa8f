"""One sequence's attention keys and values, detached from the batch that computed them.

A continuation that starts from a sequence's KV state skips re-prefilling its context, on the
engine that computed it (the next segment) or on another worker it migrates to. A state is
only valid for the model shape and the policy version that produced it, so both travel with
it and every import checks them. A state travels between workers in its wire form
(`encode`, `decode`); a batch's cache is built from states and split back into them in
relayrl_torch.sampling.kv_batch. Exercised by tests/unit/test_kv_state.py.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
import torch

from relayrl.contracts.codec import CodecError, Wire, decode, decode_array, encode, encode_array

KIND = "sequence_kv"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
Positive = Annotated[int, msgspec.Meta(gt=0)]


def windowed(model: Any) -> bool:
    """Whether some layer attends through a sliding window, whose cache cannot be cut per
    sequence (Gemma 2 and 3, Mistral with a window, ...)."""
    cfg = model.config.get_text_config(decoder=True)
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types:
        return any(t != "full_attention" for t in layer_types)
    return getattr(cfg, "sliding_window", None) is not None and \
        getattr(cfg, "use_sliding_window", True) is not False


@dataclass(frozen=True)
class ModelFingerprint:
    """What a KV state must agree on with the model that resumes from it."""

    model_type: str
    num_layers: Positive
    kv_heads: Positive
    head_dim: Positive
    hidden_size: Positive
    vocab_size: Positive
    dtype: Literal["float32", "float16", "bfloat16"]  # a key of DTYPES

    @classmethod
    def of(cls, model: Any) -> ModelFingerprint:
        cfg = model.config.get_text_config(decoder=True)
        if windowed(model):
            raise ValueError(f"kv state: {cfg.model_type} uses sliding-window attention, whose "
                             "cache cannot be cut per sequence")
        dtype = next((n for n, d in DTYPES.items() if d == model.dtype), None)
        if dtype is None:
            raise ValueError(f"kv state: model dtype {model.dtype} is not one of {list(DTYPES)}")
        heads = cfg.num_attention_heads
        return cls(
            model_type=cfg.model_type, num_layers=cfg.num_hidden_layers,
            kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size, dtype=dtype)

    def differences(self, other: ModelFingerprint) -> list[str]:
        return [f"{f.name} {getattr(self, f.name)!r} != {getattr(other, f.name)!r}"
                for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


@dataclass(frozen=True)
class SequenceKV:
    """Keys and values, [num_layers, kv_heads, len(tokens), head_dim] each, of exactly
    `tokens` (no padding), computed by weights of policy `version`."""

    tokens: tuple[int, ...]
    version: int
    fingerprint: ModelFingerprint
    keys: torch.Tensor
    values: torch.Tensor

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError("kv state: covers no tokens")
        fp = self.fingerprint
        shape = (fp.num_layers, fp.kv_heads, len(self.tokens), fp.head_dim)
        for name in ("keys", "values"):
            t = getattr(self, name)
            if tuple(t.shape) != shape or t.dtype != DTYPES[fp.dtype]:
                raise ValueError(f"kv state: {name} is {t.dtype}{tuple(t.shape)}, expected "
                                 f"{DTYPES[fp.dtype]}{shape}")

    def __len__(self) -> int:
        return len(self.tokens)

    def check_fits(self, fingerprint: ModelFingerprint, version: int) -> None:
        """Refuse a state another model shape or another policy version computed."""
        differences = self.fingerprint.differences(fingerprint)
        if differences:
            raise ValueError(f"kv state: computed by another model ({'; '.join(differences)})")
        if self.version != version:
            raise ValueError(f"kv state: computed by version {self.version}, "
                             f"the model holds {version}")

    def prefix(self, n: int) -> SequenceKV:
        return SequenceKV(self.tokens[:n], self.version, self.fingerprint,
                          self.keys[:, :, :n].clone(), self.values[:, :, :n].clone())

    def encode(self) -> bytes:
        # Raw bytes on the wire: numpy, and so the array codec, has no bfloat16.
        def raw(t: torch.Tensor) -> RawArray:
            return RawArray.of(t.detach().cpu().contiguous().view(torch.uint8).numpy())

        tokens, keys, values = (RawArray.of(np.asarray(self.tokens, dtype=np.int64)),
                                raw(self.keys), raw(self.values))
        return encode(KVWire(tokens=tokens, keys=keys, values=values, version=self.version,
                             fingerprint=self.fingerprint,
                             checksum=checksum_of({"tokens": {"data": tokens.data},
                                                   "keys": {"data": keys.data},
                                                   "values": {"data": values.data}})))

    @classmethod
    def decode(cls, payload: bytes) -> SequenceKV:
        wire = decode(payload, KVWire)
        fingerprint = wire.fingerprint
        tokens = wire.tokens.read(f"{KIND}.tokens")
        if tokens.dtype != np.int64 or tokens.ndim != 1 or len(tokens) == 0:
            raise CodecError(f"{KIND}.tokens: expected a non-empty int64 vector")
        dtype = DTYPES[fingerprint.dtype]
        shape = [fingerprint.num_layers, fingerprint.kv_heads, len(tokens),
                 fingerprint.head_dim * dtype.itemsize]
        tensors = {}
        for name in ("keys", "values"):
            arr = getattr(wire, name).read(f"{KIND}.{name}")
            if arr.dtype != np.uint8 or list(arr.shape) != shape:
                raise CodecError(f"{KIND}.{name}: {arr.dtype}{list(arr.shape)} does not fit the "
                                 f"fingerprint and {len(tokens)} tokens (uint8{shape})")
            tensors[name] = torch.from_numpy(arr.copy()).view(dtype)
        return cls(tuple(tokens.tolist()), wire.version, fingerprint, tensors["keys"],
                   tensors["values"])


def checksum_of(arrays: dict[str, dict[str, Any]]) -> int:
    crc = 0
    for name in ("tokens", "keys", "values"):
        crc = zlib.crc32(arrays[name]["data"], crc)
    return crc


class RawArray(msgspec.Struct, forbid_unknown_fields=True):
    """An array as relayrl.contracts.codec lays it out, its bytes not yet read: the checksum is
    checked before they are trusted."""

    dtype: str
    shape: list[int]
    data: bytes

    @classmethod
    def of(cls, arr: np.ndarray) -> RawArray:
        return cls(**encode_array(arr))

    def read(self, where: str) -> np.ndarray:
        return decode_array(msgspec.structs.asdict(self), where)


class KVWire(Wire, tag=KIND):
    """A SequenceKV on the wire; keys and values as uint8 [..., head_dim * itemsize]."""

    tokens: RawArray  # int64 [T]
    keys: RawArray
    values: RawArray
    version: Annotated[int, msgspec.Meta(ge=0)]
    fingerprint: ModelFingerprint
    checksum: int

    def __post_init__(self) -> None:
        # A flipped bit in the floats would decode fine and silently change the continuation.
        datas = {n: {"data": getattr(self, n).data} for n in ("tokens", "keys", "values")}
        if self.checksum != checksum_of(datas):
            raise CodecError(f"{KIND}.checksum: the arrays' bytes do not match it")


class StateCache:
    """Sequence states keyed by the tokens they cover, least recently used evicted first,
    bounded in tokens held. A capacity of 0 keeps nothing."""

    def __init__(self, capacity_tokens: int):
        if capacity_tokens < 0:
            raise ValueError(f"kv_cache_tokens: must be >= 0, got {capacity_tokens}")
        self.capacity_tokens = capacity_tokens
        self.tokens_held = 0
        self._states: OrderedDict[tuple[int, ...], SequenceKV] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def put(self, state: SequenceKV) -> bool:
        """False when the state alone exceeds the capacity (it is not kept)."""
        if len(state) > self.capacity_tokens:
            return False
        self.pop(state.tokens)
        self._states[state.tokens] = state
        self.tokens_held += len(state)
        while self.tokens_held > self.capacity_tokens:
            _, evicted = self._states.popitem(last=False)
            self.tokens_held -= len(evicted)
        return True

    def pop(self, tokens: tuple[int, ...]) -> SequenceKV | None:
        state = self._states.pop(tokens, None)
        if state is not None:
            self.tokens_held -= len(state)
        return state

    def longest_prefix(self, context: list[int]) -> SequenceKV | None:
        """The longest state covering a prefix of the context (the whole context or all but
        its last token: what the previous segment left; or less: an episode's previous turn,
        before the environment's tokens), refreshed as recently used."""
        for n in (len(context), len(context) - 1):
            state = self._states.get(tuple(context[:n])) if n > 0 else None
            if state is not None:
                self._states.move_to_end(state.tokens)
                return state
        whole = tuple(context)
        state = max((s for key, s in self._states.items()
                     if len(key) < len(whole) - 1 and whole[:len(key)] == key),
                    key=len, default=None)
        if state is not None:
            self._states.move_to_end(state.tokens)
        return state

    def clear(self) -> None:
        self._states.clear()
        self.tokens_held = 0
