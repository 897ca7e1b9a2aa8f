"""Every public module, class, function and method of the plug-in API (tasks, rewards,
environments, the buffer client) and of the `relayrl` command has a docstring, which
docs/reference/plugins.md renders."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = [*sorted((ROOT / "relayrl" / "plugins").rglob("*.py")), ROOT / "relayrl_ops" / "cli.py"]


def _undocumented(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    missing = [] if ast.get_docstring(tree) else ["<module>"]
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if node.name.startswith("_"):
            continue
        if not ast.get_docstring(node):
            missing.append(node.name)
        if isinstance(node, ast.ClassDef):
            missing += [f"{node.name}.{m.name}" for m in node.body
                        if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and not m.name.startswith("_") and not ast.get_docstring(m)]
    return missing


def test_every_public_name_of_the_plugin_api_has_a_docstring():
    missing = {str(p.relative_to(ROOT)): names for p in FILES if (names := _undocumented(p))}
    assert not missing, missing
