"""The benches' own venvs, pinned here and never project dependencies, each made on first use
and again when its pins change:

- bench/.venv: the peer a bench compares with (TRL) and the tools it runs (py-spy), with the
  project's own torch, transformers and math-verify, so the peer differs from RelayRL only in
  being the peer;
- bench/.agents-venv: the agent frameworks whose agents train through a worker's
  OpenAI-compatible server (the OpenAI Agents SDK, LangChain) and what their tools use
  (simpleeval), with nothing of RelayRL.

    python -c "from bench.tools_venv import bench_python; print(bench_python())"
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / "bench" / ".venv"
AGENTS_VENV = ROOT / "bench" / ".agents-venv"
AGENT_PINS = ["openai-agents==0.24.0", "langchain-openai==1.8.1", "langchain-core==1.8.3",
              "simpleeval==1.0.8"]
TRL_VERSION = "1.16.0"
PINS = [f"trl=={TRL_VERSION}", "py-spy==0.4.3", "torch==2.13.0",
        *(f"{name}=={version(name)}" for name in ("transformers", "math-verify"))]


def bench_python() -> Path:
    """bench/.venv's interpreter, the venv made first if it is missing or pinned otherwise."""
    return pinned_venv(VENV, PINS)


def agents_python() -> Path:
    """bench/.agents-venv's interpreter, made first like bench_python's."""
    return pinned_venv(AGENTS_VENV, AGENT_PINS)


def pinned_venv(venv: Path, pins: list[str]) -> Path:
    python = venv / "bin" / "python"
    stamp = venv / "pins.txt"
    wanted = "\n".join(pins) + "\n"
    if not stamp.is_file() or stamp.read_text() != wanted:
        print(f"making {venv}: {' '.join(pins)} ...", flush=True)
        alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not the project
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True, env=alone)
        stamp.write_text(wanted)
    return python


def bench_tool(name: str) -> Path:
    """A command the venv installs, e.g. py-spy."""
    return bench_python().parent / name
