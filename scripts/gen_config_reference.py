"""Write docs/reference/config.md from the run config's pydantic models: every section and
setting with its type, default and description, so the reference cannot drift from the code.
A choice between variants (`model.kind`, `rollout.engine.kind`, `task.source`,
`trainer.loss.name`) lists each variant with its own settings.

    python scripts/gen_config_reference.py           # write the page
    python scripts/gen_config_reference.py --check   # exit 1 if the page is stale
"""

from __future__ import annotations

import inspect
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "reference" / "config.md"

from relayrl.config import RunConfig  # noqa: E402
from scripts.pages import write_or_check  # noqa: E402

INTRO = """# Configuration

A run is one YAML file read by every service: one section per owner (`relay`, `scheduler`,
`buffer`, `rollout`, `trainer`, `eval`, ...), each a pydantic model in `relayrl/config/`,
composed by `RunConfig` (`relayrl/config/run.py`), which also checks that the sections
agree. An unknown key, a value out of range or a key that moved is refused with the field
named; `--set SECTION.FIELD=VALUE` overrides a field on the command line. `relayrl check
CONFIG` loads a config and says what the run will do.

This page is generated from the models' field descriptions
(`python scripts/gen_config_reference.py`); the tests fail when it is stale.
"""


def models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation holds (a union's variants, a list's items)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found = []
    for arg in typing.get_args(annotation):
        found += models_in(arg)
    return found


def type_name(annotation) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is not None:
        inner = ", ".join(type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return str(annotation).replace("typing.", "")


def default_of(field) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
        return "(section)" if isinstance(value, BaseModel) else f"`{value!r}`"
    if field.default is PydanticUndefined:
        return "required"
    return f"`{field.default!r}`"


def describe(model: type[BaseModel], path: str, out: list[str], seen: set) -> None:
    rows, nested = [], []
    for name, field in model.model_fields.items():
        inner = models_in(field.annotation)
        text = (field.description or "").replace("\n", " ").replace("|", "\\|")
        if inner and (len(inner) > 1 or field.default_factory is not None
                      or field.default is None):
            kinds = ", ".join(f"`{m.__name__}`" for m in inner)
            rows.append(f"| `{name}` | {kinds} | {default_of(field)} | {text} |")
            nested.append((name, inner))
        else:
            rows.append(f"| `{name}` | {type_name(field.annotation)} | {default_of(field)} | "
                        f"{text} |")
    level = "#" * min(2 + path.count("."), 4)
    doc = " ".join(inspect.cleandoc(model.__doc__ or "").split("\n\n")[0].split())
    out += [f"{level} `{path}`" + (f" ({model.__name__})" if path != "run" else ""), ""]
    if doc and model is not RunConfig:
        out += [doc, ""]
    out += ["| setting | type | default | description |", "|---|---|---|---|", *rows, ""]
    for name, inner in nested:
        for sub in inner:
            key = (f"{path}.{name}", sub)
            if key in seen:
                continue
            seen.add(key)
            where = f"{path}.{name}" if path != "run" else name
            describe(sub, where, out, seen)


def render() -> str:
    out = [INTRO]
    describe(RunConfig, "run", out, set())
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str]) -> int:
    return write_or_check({OUT: render}, argv, "gen_config_reference.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
