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


@pytest.mark.parametrize("line", [
    "Added in session 12.", "as sessions 3-5 measured", "Fixes issue 18", "see Issue #7",
    "the issue asks for 2x", "the issue's target holds", "short of the issue's bar"])
def test_build_history_is_flagged(line):
    assert _load().PHRASES.search(line)


@pytest.mark.parametrize("line", [
    "@pytest.fixture(scope=\"session\")", "its own session: the ranks go too",
    "an issue with the socket path", "issues a lease to each worker", "2 issues remain"])
def test_ordinary_uses_pass(line):
    assert not _load().PHRASES.search(line)


def test_the_tracked_text_passes():
    assert _load().main() == 0
