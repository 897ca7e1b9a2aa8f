"""Write the API reference pages from the sources the services are built from:
docs/reference/grpc.md from the protos (protos/relayrl_api/v1/*.proto: every service, rpc,
message, field and enum with its comments) and docs/reference/rest.md from the scheduler's
OpenAPI document (docs/openapi.json: every route and schema), so neither can drift.

    python scripts/gen_api_reference.py           # write both pages
    python scripts/gen_api_reference.py --check   # exit 1 if either page is stale
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.pages import write_or_check  # noqa: E402

PROTOS = ROOT / "protos" / "relayrl_api" / "v1"
OPENAPI = ROOT / "docs" / "openapi.json"
GRPC_OUT = ROOT / "docs" / "reference" / "grpc.md"
REST_OUT = ROOT / "docs" / "reference" / "rest.md"

GRPC_INTRO = """# gRPC API

Every service speaks gRPC (package `relayrl.v1`), defined in `protos/relayrl_api/v1/`; the
Python stubs are generated from them (`python scripts/gen_protos.py`). Every method takes the
run's token as `authorization: Bearer <token>` metadata, and the token's role decides what it
may call ([security and limits](../guides/security.md)). Every service also serves the
standard gRPC health service.

This page is generated from the protos' comments (`python scripts/gen_api_reference.py`);
the tests fail when it is stale.
"""

REST_INTRO = """# REST API

The scheduler serves a REST control API on `scheduler.rest_port`, described by an OpenAPI
document it generates (`python -m scheduler_svc.openapi --write` writes
[openapi.json](../openapi.json); a running scheduler serves it at `/openapi.json` and
interactive docs at `/docs`). Every route needs `Authorization: Bearer <token>`; how the
`relayrl` command uses it is in [run control and the CLI](../guides/cli.md).

This page is generated from that document (`python scripts/gen_api_reference.py`); the tests
fail when it is stale.
"""

FIELD = re.compile(r"^(repeated |optional )?([\w.]+|map<[\w., ]+>)\s+(\w+)\s*=\s*(\d+);")
RPC = re.compile(r"^rpc (\w+)\s*\((stream )?([\w.]+)\)\s*returns\s*\((stream )?([\w.]+)\)")
ENUM_VALUE = re.compile(r"^(\w+)\s*=\s*(-?\d+);")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def parse_proto(text: str) -> dict:
    """The file's comment and its services, messages and enums, each with its comment and
    members (a member's comment: the lines above it and the one trailing it)."""
    doc: list[str] = []
    comment: list[str] = []
    stack: list[dict] = []
    blocks: list[dict] = []
    last = None  # the member whose trailing comment a comment-only line may continue
    for raw in text.splitlines():
        line = raw.strip()
        code, _, trailing = line.partition("//")
        code = code.strip()
        if not code:
            if trailing or line.startswith("//"):
                column = raw.index("//")
                if last is not None and last.get("column") == column:
                    last["doc"] += " " + trailing.strip()
                else:
                    comment.append(trailing.strip())
                    last = None
            else:
                comment, last = ([] if not stack else comment), None
            continue
        last = None
        if code.startswith("package "):
            doc, comment = comment, []
            continue
        if code.startswith(("syntax", "import", "option")):
            comment = []
            continue
        head = re.match(r"^(message|service|enum|oneof)\s+(\w+)\s*\{", code)
        if head:
            kind, name = head.groups()
            if kind == "oneof":
                stack.append({"kind": "oneof", "name": name, "parent": stack[-1]})
            else:
                block = {"kind": kind, "name": name, "doc": " ".join(comment), "members": [],
                         "outer": stack[-1]["name"] if stack else None}
                blocks.append(block)
                stack.append(block)
            comment = []
            if code.endswith("}"):
                stack.pop()
            continue
        if code.startswith("}"):
            stack.pop()
            comment = []
            continue
        owner = stack[-1] if stack else None
        if owner is None:
            comment = []
            continue
        oneof = None
        if owner["kind"] == "oneof":
            oneof, owner = owner["name"], owner["parent"]
        member = None
        if m := RPC.match(code):
            name, s_in, req, s_out, resp = m.groups()
            member = {"name": name, "request": f"{s_in or ''}{req}",
                      "response": f"{s_out or ''}{resp}"}
        elif m := FIELD.match(code):
            label, typ, name, number = m.groups()
            member = {"name": name, "number": number,
                      "type": f"{label or ''}{typ}" + (f" (oneof {oneof})" if oneof else "")}
        elif m := ENUM_VALUE.match(code):
            member = {"name": m.group(1), "number": m.group(2)}
        if member is not None:
            member["doc"] = " ".join([*comment, trailing.strip()]).strip()
            if trailing:
                member["column"] = raw.index("//")
            owner["members"].append(member)
            last = member if trailing else None
        comment = []
    return {"doc": " ".join(doc), "blocks": blocks}


def render_grpc() -> str:
    out = [GRPC_INTRO]
    for path in sorted(PROTOS.glob("*.proto")):
        proto = parse_proto(path.read_text())
        out += [f"## `{path.name}`", ""]
        if proto["doc"]:
            out += [proto["doc"], ""]
        services = [b for b in proto["blocks"] if b["kind"] == "service"]
        others = [b for b in proto["blocks"] if b["kind"] != "service"]
        for block in services + others:
            name = f"{block['outer']}.{block['name']}" if block["outer"] else block["name"]
            out += [f"### {block['kind']} `{name}`", ""]
            if block["doc"]:
                out += [_cell(block["doc"]), ""]
            if not block["members"]:
                out += ["(no fields)", ""]
                continue
            if block["kind"] == "service":
                out += ["| rpc | request | response | description |", "|---|---|---|---|"]
                out += [f"| `{m['name']}` | `{m['request']}` | `{m['response']}` | "
                        f"{_cell(m['doc'])} |" for m in block["members"]]
            elif block["kind"] == "enum":
                out += ["| value | number | description |", "|---|---|---|"]
                out += [f"| `{m['name']}` | {m['number']} | {_cell(m['doc'])} |"
                        for m in block["members"]]
            else:
                out += ["| field | type | number | description |", "|---|---|---|---|"]
                out += [f"| `{m['name']}` | `{m['type']}` | {m['number']} | {_cell(m['doc'])} |"
                        for m in block["members"]]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _schema_name(schema: dict) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_schema_name(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_schema_name(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{v!r}`" for v in schema["enum"])
    if schema.get("type") == "object" and "additionalProperties" in schema and isinstance(
            schema["additionalProperties"], dict):
        return f"object of {_schema_name(schema['additionalProperties'])}"
    return f"`{schema.get('type', 'any')}`"


def _body(content: dict | None) -> str:
    if not content:
        return ""
    schema = next(iter(content.values())).get("schema", {})
    return _schema_name(schema)


def render_rest() -> str:
    doc = json.loads(OPENAPI.read_text())
    out = [REST_INTRO, "## Routes", ""]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            out += [f"### `{method.upper()} {path}`", ""]
            if op.get("description"):
                out += [" ".join(op["description"].split()), ""]
            elif op.get("summary"):
                out += [op["summary"] + ".", ""]
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | type | description |", "|---|---|---|---|"]
                out += [f"| `{p['name']}` | {p['in']} | {_schema_name(p.get('schema', {}))} | "
                        f"{_cell(p.get('description', ''))} |" for p in params]
                out.append("")
            if "requestBody" in op:
                out += [f"Body: {_body(op['requestBody'].get('content'))}", ""]
            out += ["| status | body | when |", "|---|---|---|"]
            out += [f"| {code} | {_body(r.get('content'))} | {_cell(r.get('description', ''))} |"
                    for code, r in op.get("responses", {}).items()]
            out.append("")
    out += ["## Schemas", ""]
    for name, schema in doc.get("components", {}).get("schemas", {}).items():
        out += [f"### {name}", ""]
        if schema.get("description"):
            out += [" ".join(schema["description"].split()), ""]
        if "enum" in schema:
            out += ["One of " + ", ".join(f"`{v}`" for v in schema["enum"]) + ".", ""]
            continue
        props = schema.get("properties", {})
        if props:
            required = set(schema.get("required", []))
            out += ["| field | type | required | description |", "|---|---|---|---|"]
            for field, spec in props.items():
                bounds = [f"{k} {spec[k]:g}" for k in ("minimum", "maximum") if k in spec]
                text = _cell(spec.get("description", "")) + (
                    f" ({', '.join(bounds)})" if bounds else "")
                out.append(f"| `{field}` | {_schema_name(spec)} | "
                           f"{'yes' if field in required else 'no'} | {text} |")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


PAGES = {GRPC_OUT: render_grpc, REST_OUT: render_rest}


def main(argv: list[str]) -> int:
    return write_or_check(PAGES, argv, "gen_api_reference.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
