"""Writing a generated docs page, or checking that the committed one is current: what the
reference generators (scripts/gen_*_reference.py) share."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path


def write_or_check(pages: Mapping[Path, Callable[[], str]], argv: list[str],
                   script: str) -> int:
    """Write each page from its renderer; with --check in `argv`, write nothing and return 1
    naming every page that differs from what `script` would write."""
    stale = []
    for out, render in pages.items():
        text = render()
        if "--check" in argv:
            if not out.is_file() or out.read_text() != text:
                stale.append(out)
        else:
            out.write_text(text)
    for out in stale:
        print(f"{out} is stale: run python scripts/{script}", file=sys.stderr)
    return 1 if stale else 0
