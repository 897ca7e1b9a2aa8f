"""The generated results pages quote what the results files hold: the newest run of every
command in full, every run listed, smoke runs left out, and a picture only beside the run
that drew it last."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scripts import gen_results_pages as pages  # noqa: E402


def record(command: str, date: str, **figures) -> dict:
    return {"bench": "scale", **figures, "command": command, "commit": "abc123",
            "date": date, "machine": {"cpus": 2}}


@pytest.fixture
def docs(tmp_path, monkeypatch):
    monkeypatch.setattr(pages, "DOCS", tmp_path)
    return tmp_path


def write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "scale.jsonl"  # a bench that exists, for its docstring
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_newest_run_of_each_command_is_shown_and_smoke_runs_are_not(docs, tmp_path):
    path = write(tmp_path, [
        record("python bench/scale.py", "2026-01-01", speedup=4.0),
        record("python bench/scale.py --workers 8", "2026-01-02", speedup=3.0),
        record("python bench/scale.py", "2026-01-03", speedup=5.0),
        record("python bench/scale.py --smoke", "2026-01-04", speedup=9.0),
    ])
    text = pages.page(path)
    assert "| `speedup` | 5 |" in text and "| `speedup` | 3 |" in text
    assert "| `speedup` | 4 |" not in text  # an older run of a command shown again later
    assert "| `speedup` | 9 |" not in text and "--smoke" not in text
    assert text.index("python bench/scale.py`\n") < text.index("--workers 8`\n")
    assert text.count("| 2026-01-0") == 3  # every measured run listed


def test_a_picture_is_shown_beside_the_newest_run_that_drew_it(docs, tmp_path):
    (docs / "scale.png").write_bytes(b"png")
    path = write(tmp_path, [
        record("python bench/scale.py --workers 8", "2026-01-01", picture="scale.png"),
        record("python bench/scale.py", "2026-01-02", picture="scale.png"),
    ])
    text = pages.page(path)
    assert text.count("](scale.png)") == 1
    newest = text.split("## `python bench/scale.py --workers 8`")[0]
    assert "](scale.png)" in newest


def test_a_picture_that_is_missing_is_not_linked(docs, tmp_path):
    path = write(tmp_path, [record("python bench/scale.py", "2026-01-01", picture="gone.png")])
    assert "gone.png" not in pages.page(path)


def test_every_benchmark_has_a_page_even_before_its_first_run():
    names = {p.stem for p in pages.benchmarks()}
    assert {"gpu_smoke", "throughput", "longtail", "scale"} <= names
    assert "harness" not in names and "common" not in names
    missing = pages.RESULTS / "no_such_bench.jsonl"
    assert pages.runs(missing) == []
