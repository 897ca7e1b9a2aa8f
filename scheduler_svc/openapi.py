"""The control API's OpenAPI schema, as checked in at docs/openapi.json.

    python -m scheduler_svc.openapi            # print it
    python -m scheduler_svc.openapi --write    # rewrite docs/openapi.json
    python -m scheduler_svc.openapi --check    # exit 1 if docs/openapi.json is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scheduler_svc.rest import build_rest_app

CHECKED_IN = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"


def render() -> str:
    schema = build_rest_app(None, "schema-only").openapi()
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduler_svc.openapi")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"rewrite {CHECKED_IN}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 if {CHECKED_IN} is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        CHECKED_IN.write_text(text)
    elif args.check:
        if not CHECKED_IN.is_file() or CHECKED_IN.read_text() != text:
            print(f"{CHECKED_IN} differs from the app's schema; run "
                  "python -m scheduler_svc.openapi --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
