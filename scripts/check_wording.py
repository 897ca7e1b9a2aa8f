"""Fail on text that tells how the project was built instead of what it is: a numbered work
session, a ticket number, or a ticket's target or bar (PHRASES). History belongs in
CHANGELOG.md and commit messages; code, tests and docs speak of RelayRL itself.

    python scripts/check_wording.py          # exit 1, listing file:line of each
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHRASES = re.compile(r"\b(s[e]ssions? \d|i[s]sues? #?\d|the i[s]sue\b|i[s]sue's (target|bar))",
                     re.IGNORECASE)
EXEMPT = {"CHANGELOG.md"}
TEXT = (".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".proto", ".cfg", "Makefile",
        "Dockerfile")


def main() -> int:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    found = []
    for name in files:
        if name in EXEMPT or not name.endswith(TEXT):
            continue
        try:
            lines = (ROOT / name).read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        found += [f"{name}:{i}: {line.strip()[:100]}" for i, line in enumerate(lines, 1)
                  if PHRASES.search(line)]
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} lines speak of sessions or issues; say what the project is "
              "and does (history goes to CHANGELOG.md)", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
