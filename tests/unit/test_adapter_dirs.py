"""The vLLM engine's adapter directories live in /dev/shm, which is memory and outlives the
process: a worker that exits without closing its engine (as on SIGTERM) leaves none behind."""

import subprocess
import sys
from pathlib import Path

from relayrl_testkit.families import build_family
from relayrl_torch.models.smollm2 import ensure_smollm2

ROOT = Path(__file__).resolve().parents[2]

EXITS_WITHOUT_CLOSING = """
import sys, torch
from pathlib import Path
from relayrl.config.trainer import LoraConfig
from rollout_svc.engines.vllm_lora import AdapterVersions
versions = AdapterVersions(Path(sys.argv[1]), LoraConfig(rank=4), torch.float32)
versions.write({k: torch.zeros(t.shape, dtype=t.dtype) for k, t in versions.expected.items()}, 1)
print(versions.root, flush=True)
"""


def test_the_adapter_directory_goes_when_the_process_exits(tmp_path):
    model = build_family("llama", tmp_path / "llama",
                         ensure_smollm2(ROOT / ".cache/relayrl/models"))
    proc = subprocess.run([sys.executable, "-c", EXITS_WITHOUT_CLOSING, str(model)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    root = Path(proc.stdout.strip().splitlines()[-1])
    assert root.name.startswith("relayrl-lora-")
    assert not root.exists()
