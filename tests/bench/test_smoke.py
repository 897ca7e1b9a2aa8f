"""Every benchmark in bench/ runs its real path at the smallest size (`--smoke`) and ends
with its JSON line, so none can stop working unnoticed. A benchmark that cannot run here (no
GPU, no benches' venv) says why in that line and exits 0."""

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
TOO_LONG = {
    "convergence": "its smallest schedule trains several seeds and modes end to end (about "
                   "two minutes on 2 cores), past this file's budget; run "
                   "`python bench/convergence.py --smoke` by hand",
    "own_task": "its smoke run (two configs, each with a held-out evaluation before and "
                "after its minutes of training) still took over 200 s on 2 cores",
}
TIMEOUT_S = 240


def benchmarks() -> list[str]:
    return sorted(p.stem for p in (ROOT / "bench").glob("*.py")
                  if "\ndef main(" in p.read_text() and p.stem not in PEER_SIDES)


def params() -> list:
    return [pytest.param(name, marks=pytest.mark.skip(reason=TOO_LONG[name]))
            if name in TOO_LONG else name for name in benchmarks()]


@pytest.mark.parametrize("name", params())
def test_smoke(name: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, f"bench/{name}.py", "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    record = json.loads(lines[-1])
    assert isinstance(record, dict)
    if record.get("smoke") == "skipped":
        assert record["reason"]
