"""Services that hold no model start without torch: importing it costs about a second of CPU
a process, and on a small machine every service starts at once on the same cores."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("module", ["scheduler_svc.server", "buffer_svc.server",
                                    "relayrl_ops.cli"])
def test_a_service_without_a_model_imports_no_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["False", "False"], f"{module} imports torch or transformers"


def test_the_scheduler_builds_its_task_without_the_model_side():
    code = ("import sys, scheduler_svc.server; "
            "print(sorted(m for m in sys.modules if m.startswith('relayrl_torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]", f"scheduler_svc.server imports {out.strip()}"


def test_the_episode_rules_import_no_torch():
    code = ("import sys, relayrl_tasks.episodes.play, relayrl_tasks.episodes.reward, "
            "relayrl_tasks.episodes.sequence; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False", "relayrl_tasks.episodes imports torch"
