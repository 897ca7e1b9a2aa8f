"""Write docs/reference/cli.md from the `relayrl` command's own argparse parser, so the
reference lists every subcommand and flag as the command takes them.

    python scripts/gen_cli_reference.py           # write the page
    python scripts/gen_cli_reference.py --check   # exit 1 if the page is stale
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "reference" / "cli.md"

from relayrl_ops.cli import build_parser  # noqa: E402
from scripts.pages import write_or_check  # noqa: E402

INTRO = """# The `relayrl` command

Installed with the package (`pip install -e .`, or `make install`). Each subcommand's help
is `relayrl SUBCOMMAND --help`; this page is generated from the same parser
(`python scripts/gen_cli_reference.py`), and the tests fail when it is stale.
"""


def render() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fixed, so the page is
    parser = build_parser()
    out = [INTRO, "```text", parser.format_help().rstrip(), "```", ""]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        out += [f"## `relayrl {name}`", "", "```text", command.format_help().rstrip(), "```",
                ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    return write_or_check({OUT: render}, argv, "gen_cli_reference.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
