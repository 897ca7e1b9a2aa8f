"""Field types of request models that take JSON as JSON means it: a number is not a bool or
a string. Pydantic's lax mode turns true into 1 and "1" into 1; its strict mode also refuses
3.0 for an integer, which JSON Schema (and so the published OpenAPI schema) calls an
integer. `json_int` takes integers and integral numbers, nothing else; a float field takes
`Strict()` (which still takes integers) and `allow_inf_nan=False` on its model."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Strict


def _number_not_bool_or_text(value: Any) -> Any:
    if isinstance(value, bool | str | bytes):
        raise ValueError(f"Input should be a JSON integer, not {type(value).__name__}")
    return value


def json_int(*constraints: Any) -> Any:
    """int under `constraints` (Field(ge=...), annotated_types.Ge(...)), as a JSON integer.
    The constraints come first: after the validator, pydantic would check them itself and
    publish them as `ge` rather than JSON Schema's `minimum`."""
    # Strict(False): lax even inside a strict model, for 3.0; the validator refuses the rest
    return Annotated[(int, *constraints, Strict(False),
                      BeforeValidator(_number_not_bool_or_text))]
