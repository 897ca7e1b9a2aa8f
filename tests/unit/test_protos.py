"""A client of RelayRL's own compiled from protos/ the obvious way gets a package that does
not shadow the project's `relayrl`, and speaks the same services."""

import subprocess
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]


def test_stubs_compiled_from_protos_do_not_shadow_the_project(tmp_path):
    protos = sorted((ROOT / "protos").rglob("*.proto"))
    well_known = Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{ROOT / 'protos'}", f"-I{well_known}", f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}", *map(str, protos)]
    assert protoc.main(args) == 0
    top = {p.name for p in tmp_path.iterdir()}
    assert top == {"relayrl_api"}, top
    # in a process of its own: the same messages from two files cannot share one pool
    probe = ("from relayrl_api.v1 import buffer_pb2, scheduler_pb2_grpc; "
             "print(buffer_pb2.DESCRIPTOR.services_by_name['Buffer'].full_name)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "relayrl.v1.Buffer"
