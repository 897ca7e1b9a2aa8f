"""The benches' own venv, bench/.venv: the peer a bench compares with (TRL) and the tools it
runs (py-spy), pinned here and never project dependencies. It is made on first use with the
project's own torch, transformers and math-verify, so the peer differs from RelayRL only in
being the peer; a change of PINS makes it again.

    python -c "from bench.tools_venv import bench_python; print(bench_python())"
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / "bench" / ".venv"
TRL_VERSION = "1.16.0"
PINS = [f"trl=={TRL_VERSION}", "py-spy==0.4.3", "torch==2.13.0",
        *(f"{name}=={version(name)}" for name in ("transformers", "math-verify"))]


def bench_python() -> Path:
    """The venv's interpreter, the venv made first if it is missing or pinned otherwise."""
    python = VENV / "bin" / "python"
    stamp = VENV / "pins.txt"
    wanted = "\n".join(PINS) + "\n"
    if not stamp.is_file() or stamp.read_text() != wanted:
        print(f"making {VENV}: {' '.join(PINS)} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PINS], check=True)
        stamp.write_text(wanted)
    return python


def bench_tool(name: str) -> Path:
    """A command the venv installs, e.g. py-spy."""
    return bench_python().parent / name
