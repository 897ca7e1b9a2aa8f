"""The shared core (`relayrl/`) imports no torch: every module of it loads in a process that
has neither torch nor transformers afterwards, so the buffer, the scheduler and a user's
reward or environment server carry none of the model side (`relayrl_torch/`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import importlib, json, pkgutil, sys
import relayrl
names = [m.name for m in pkgutil.walk_packages(relayrl.__path__, "relayrl.")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"modules": len(names),
                  "heavy": [m for m in ("torch", "transformers") if m in sys.modules]}))
"""


def test_every_core_module_imports_without_torch():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["modules"] > 50, found  # the walk reached the core's modules
    assert found["heavy"] == [], f"importing the core loaded {found['heavy']}"
