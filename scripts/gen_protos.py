"""Regenerate the gRPC stubs in relayrl/contracts/proto/ from protos/.

The .proto files live in protos/relayrl_api/v1/ (package relayrl.v1). They are compiled under
the virtual path relayrl/contracts/proto/v1/, so the generated modules import each other as
`relayrl.contracts.proto.v1.*` with no rewriting. `--check` fails when the checked-in stubs differ.

The directory is not named `relayrl` so that a user who compiles protos/ for a client of
their own (`-Iprotos`) gets the package `relayrl_api.v1`, not one that shadows this project.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "protos" / "relayrl_api" / "v1"
OUT_PKG = ROOT / "relayrl" / "contracts" / "proto"


def generate(out_root: Path) -> None:
    protos = sorted(PROTO_DIR.glob("*.proto"))
    well_known = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-Irelayrl/contracts/proto/v1={PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *[str(p) for p in protos],
    ]
    # the mypy plugins are console scripts installed beside this interpreter
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    stubs = out_root / "relayrl" / "contracts" / "proto"
    for pkg in (stubs, stubs / "v1"):
        (pkg / "__init__.py").write_text(
            '"""Generated gRPC stubs; regenerate with scripts/gen_protos.py."""\n')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the stubs are out of date")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = Path(tmp) / "relayrl" / "contracts" / "proto"
        if args.check:
            diff = filecmp.dircmp(fresh / "v1", OUT_PKG / "v1")
            stale = diff.left_only + diff.right_only + diff.diff_files
            stale = [f for f in stale if f != "__pycache__"]
            if stale or not filecmp.cmp(fresh / "__init__.py", OUT_PKG / "__init__.py", False):
                print(f"generated stubs are stale: {sorted(stale)}; run make protos",
                      file=sys.stderr)
                return 1
            print("stubs up to date")
            return 0
        shutil.rmtree(OUT_PKG, ignore_errors=True)
        shutil.copytree(fresh, OUT_PKG)
    print(f"wrote {OUT_PKG.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
