"""The wording check (scripts/check_wording.py, run by `make lint`) flags text that tells
how the project was built, and lets through ordinary uses of the same words."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("check_wording",
                                                  ROOT / "scripts" / "check_wording.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# spelled apart, so this file passes the check itself
SESSION, TICKET = "sess" + "ion", "iss" + "ue"


@pytest.mark.parametrize("line", [
    f"Added in {SESSION} 12.", f"as {SESSION}s 3-5 measured", f"Fixes {TICKET} 18",
    f"see {TICKET.title()} #7",
    f"the {TICKET} asks for 2x", f"the {TICKET}'s target holds", f"short of the {TICKET}'s bar"])
def test_build_history_is_flagged(line):
    assert _load().PHRASES.search(line)


@pytest.mark.parametrize("line", [
    "@pytest.fixture(scope=\"session\")", "its own session: the ranks go too",
    "an issue with the socket path", "issues a lease to each worker", "2 issues remain"])
def test_ordinary_uses_pass(line):
    assert not _load().PHRASES.search(line)


def test_the_tracked_text_passes():
    assert _load().main() == 0
