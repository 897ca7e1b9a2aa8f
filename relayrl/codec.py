"""Wire codec: msgpack maps with a schema version; arrays as raw bytes with dtype and shape."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

SCHEMA_VERSION = 1
_ALLOWED_DTYPES = {"int32", "int64", "float16", "float32", "float64", "uint8", "bool"}


class CodecError(ValueError):
    """A payload that cannot be decoded; the message names the offending field."""


def encode_array(arr: np.ndarray) -> dict[str, Any]:
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:  # not ascontiguousarray: it turns a 0-d array into 1-d
        arr = arr.copy(order="C")
    if arr.dtype.name not in _ALLOWED_DTYPES:
        raise CodecError(f"dtype {arr.dtype.name} is not supported on the wire")
    return {"dtype": arr.dtype.name, "shape": list(arr.shape), "data": arr.tobytes()}


def decode_array(obj: Any, field: str) -> np.ndarray:
    if not isinstance(obj, dict) or set(obj) != {"dtype", "shape", "data"}:
        raise CodecError(f"{field}: expected an array with dtype, shape and data")
    dtype, shape, data = obj["dtype"], obj["shape"], obj["data"]
    if dtype not in _ALLOWED_DTYPES:
        raise CodecError(f"{field}.dtype: {dtype!r} is not one of {sorted(_ALLOWED_DTYPES)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise CodecError(f"{field}.shape: expected a list of non-negative ints, got {shape!r}")
    if not isinstance(data, bytes):
        raise CodecError(f"{field}.data: expected bytes")
    expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if len(data) != expected:
        raise CodecError(
            f"{field}.data: {len(data)} bytes do not fit dtype {dtype} and shape {shape} "
            f"({expected} bytes)"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def pack(kind: str, body: dict[str, Any]) -> bytes:
    return msgpack.packb({"schema": SCHEMA_VERSION, "kind": kind, **body}, use_bin_type=True)


def unpack(payload: bytes, kind: str) -> dict[str, Any]:
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as err:  # msgpack raises several unrelated types
        raise CodecError(f"payload is not valid msgpack: {err}") from None
    if not isinstance(obj, dict):
        raise CodecError("payload: expected a map at the top level")
    if obj.get("schema") != SCHEMA_VERSION:
        raise CodecError(f"schema: expected {SCHEMA_VERSION}, got {obj.get('schema')!r}")
    if obj.get("kind") != kind:
        raise CodecError(f"kind: expected {kind!r}, got {obj.get('kind')!r}")
    return obj
