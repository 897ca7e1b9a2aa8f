"""The plug-in API's older import paths still import: each warns once, at the line that
imports it, naming the module it moved to, and gives that module's own objects; a name that
lives in another module now is refused naming that module."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MOVED = {
    "relayrl.envs": "relayrl.plugins.envs",
    "relayrl.envs.protocol": "relayrl.plugins.envs.protocol",
    "relayrl.rewards": "relayrl.plugins.rewards",
    "relayrl.rewards.registry": "relayrl.plugins.rewards.registry",
    "relayrl.tasks": "relayrl.plugins.tasks",
    "relayrl.tasks.problem": "relayrl.plugins.tasks.problem",
    "relayrl.buffer_client": "relayrl.plugins.buffer_client",
    "relayrl.models.chat": "relayrl.plugins.chat",
}

# imports the old path twice in a fresh interpreter and compares it with the new one
PROBE = """
import importlib, json, sys, warnings
old, new = sys.argv[1:]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    exec(f"import {old}")
    exec(f"import {old}")
alias, target = sys.modules[old], importlib.import_module(new)
names = list(getattr(target, "__all__", None)
             or [n for n in vars(target) if not n.startswith("_")])
print(json.dumps({
    "warnings": [[w.category.__name__, str(w.message), w.filename] for w in caught
                 if str(w.message).startswith(old + " moved")],
    "names": len(names),
    "different": [n for n in names if getattr(alias, n) is not getattr(target, n)],
    "all": sorted(alias.__all__) == sorted(names)}))
"""


@pytest.mark.parametrize("old,new", MOVED.items(), ids=list(MOVED))
def test_an_old_path_warns_once_and_gives_the_new_modules_objects(old, new):
    out = subprocess.run([sys.executable, "-c", PROBE, old, new], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["warnings"] == [["DeprecationWarning",
                                  f"{old} moved to {new}; import it from there", "<string>"]]
    assert found["names"] > 0 and found["different"] == [] and found["all"], found


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("old,name,where", [
    ("relayrl.envs", "load_environment", "relayrl_tasks.envs"),
    ("relayrl.envs", "TurnGlue", "relayrl_tasks.episodes.turns"),
    ("relayrl.envs.protocol", "import_user_module", "relayrl_tasks.envs.loading"),
    ("relayrl.rewards", "math_verify", "relayrl_tasks.rewards"),
    ("relayrl.tasks", "make_task", "relayrl_tasks.tasks"),
])
def test_a_name_that_lives_elsewhere_now_is_refused_naming_its_module(old, name, where):
    with pytest.raises(ImportError, match=rf"cannot import name '{name}' from '{old}': it "
                       rf"moved to {where}; import it from there"):
        exec(f"from {old} import {name}")
    assert hasattr(importlib.import_module(where), name)
    with pytest.raises(AttributeError, match=f"module '{old}' .* has no attribute 'nothing'"):
        _ = importlib.import_module(old).nothing
