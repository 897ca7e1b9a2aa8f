"""Every benchmark in bench/ runs its real path at the smallest size (`--smoke`) and ends
with its JSON line and its results line, so none can stop working unnoticed. A benchmark
that cannot run here (no GPU, no benches' venv) says why in both and exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the peer's side of peers.py and peers_step.py: run by them, in the benches' own venv
PEER_SIDES = {"peers_trl", "peers_step_trl"}
TIMEOUT_S = 240


def benchmarks() -> list[str]:
    return sorted(p.stem for p in (ROOT / "bench").glob("*.py")
                  if "\ndef main(" in p.read_text() and p.stem not in PEER_SIDES)


@pytest.mark.parametrize("name", benchmarks())
def test_smoke(name: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results = tmp_path / f"{name}.jsonl"
    try:
        proc = subprocess.run([sys.executable, f"bench/{name}.py", "--smoke", "--results",
                               str(results)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as err:  # where it was when stopped, not a bare timeout
        out = [(b.decode(errors="replace") if isinstance(b, bytes) else b or "")[-3000:]
               for b in (err.stdout, err.stderr)]
        pytest.fail(f"bench/{name}.py --smoke ran past {TIMEOUT_S} s\n" + "\n".join(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    record = json.loads(lines[-1])
    assert isinstance(record, dict)
    if record.get("smoke") == "skipped":
        assert record["reason"]
    [line] = [json.loads(row) for row in results.read_text().splitlines()]
    assert json.dumps({k: line[k] for k in record}, sort_keys=True) == json.dumps(
        record, sort_keys=True)  # NaN, which a bench may report, equals nothing
    assert line["command"] == f"python bench/{name}.py --smoke --results {results}"
    assert line["commit"] and line["date"] and line["machine"]["cpus"]
