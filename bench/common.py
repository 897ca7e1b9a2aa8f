"""What the benchmarks share: starting one service process from a config dict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from relayrl.grpc_util import wait_healthy
from relayrl.procs import child_env

ROOT = Path(__file__).resolve().parents[1]


def spawn_service(module: str, config: dict, workdir: Path, name: str, address: str,
                  timeout_s: float = 300) -> subprocess.Popen:
    """`python -m module --config` with its log in `workdir`, healthy on `address`; it dies
    with this script, even on a crash."""
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    with open(workdir / f"{name}.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", module, "--config", str(path)],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=child_env())
    wait_healthy(address, timeout_s, alive=lambda: proc.poll() is None)
    return proc
