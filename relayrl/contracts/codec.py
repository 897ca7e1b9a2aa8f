"""Wire codec: msgpack maps with a schema version; arrays as raw bytes with dtype and shape.

Wire structs subclass `Wire` (a msgspec.Struct tagged with its kind) and are declared once,
where they live; `encode` and `decode(payload, Type)` turn them into bytes and back by their
declared field types, refusing a payload with a CodecError that names the field
("batch.groups[2].samples[5].versions.data: ..."). A gRPC message that is a struct's
language-neutral form (Buffer.Submit's Trajectory is a Sample's) becomes that struct by
`from_proto`, field by field of the same name.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Literal, TypeVar

import msgspec
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


class Wire(msgspec.Struct, kw_only=True, tag_field="kind"):
    """A wire struct: a msgpack map of its fields, tagged "kind" with the subclass's tag.
    Checks a struct makes of itself (`__post_init__`) raise CodecError with a message that
    starts with its tag and the field ("sample.versions: ..."), named in full by `decode`."""

    schema: Literal[1] = SCHEMA_VERSION


W = TypeVar("W", bound=Wire)


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return encode_array(obj)
    raise NotImplementedError(f"{type(obj).__name__} is not supported on the wire")


def _dec_hook(typ: type, obj: Any) -> Any:
    if typ is np.ndarray:
        return decode_array(obj, "array")
    raise NotImplementedError(f"{typ.__name__} is not supported on the wire")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_AT = re.compile(r"(.*) - at `\$(.*)`", re.S)
_OWN = re.compile(r"[a-z_]+(?=[.:\[])")


@functools.cache
def _decoder(typ: type[W]) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(typ, dec_hook=_dec_hook)


def encode(obj: Wire) -> bytes:
    return _ENCODER.encode(obj)


def decode(payload: bytes, typ: type[W]) -> W:
    """`payload` as a `typ`, or a CodecError naming the field from the struct's kind down."""
    try:
        return _decoder(typ).decode(payload)
    except msgspec.ValidationError as err:
        raise CodecError(_named(str(err), typ.__struct_config__.tag)) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as err:
        raise CodecError(f"payload is not valid msgpack: {err}") from None


def from_proto(message: Any, typ: type[W], **fields: Any) -> W:
    """The proto message `message` as the wire struct `typ`, whose language-neutral form it
    is: each proto field goes to the struct's field of the same name, so neither names a field
    the other lacks (a proto field the struct does not declare is a TypeError). A field the
    proto leaves at its default (0, "", empty) takes the struct's own default where it
    declares one; `fields` gives what the proto does not carry. The struct's own checks
    (`__post_init__`) apply, raising CodecError as for a decoded payload."""
    given = {d.name for d, _ in message.ListFields()}
    defaulted = {f.name for f in msgspec.structs.fields(typ) if not f.required}
    values = {d.name: getattr(message, d.name) for d in message.DESCRIPTOR.fields
              if d.name in given or d.name not in defaulted}
    return typ(**values, **fields)


def _named(message: str, root: str) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.groups[0].prompt_id`" as
    "batch.groups[0].prompt_id: expected `int`, got `str`"."""
    at = _AT.fullmatch(message)
    text, path = (at[1], at[2]) if at else (message, "")
    own = _OWN.match(text)  # our own checks: "sample.versions: ...", "array.data: ..."
    if own:
        return f"{root}{path}{text[own.end():]}"
    return f"{root}{path}: {text[:1].lower()}{text[1:]}"
