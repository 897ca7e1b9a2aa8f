"""The generated reference pages match the code they are generated from: the configuration
reference (scripts/gen_config_reference.py, from the pydantic field descriptions), the
`relayrl` command's (scripts/gen_cli_reference.py, from its argparse parser) and the APIs'
(scripts/gen_api_reference.py, from the protos and the OpenAPI document). A changed field,
default, description, subcommand, flag, rpc or route without a regenerated page fails."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["gen_config_reference.py", "gen_cli_reference.py", "gen_api_reference.py"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_committed_page_is_current(script):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--check"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def _load(script):
    spec = importlib.util.spec_from_file_location(script.removesuffix(".py"),
                                                  ROOT / "scripts" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", SCRIPTS[:2])
def test_a_stale_page_fails_the_check(script, tmp_path, monkeypatch):
    module = _load(script)
    page = tmp_path / "page.md"
    page.write_text(module.render().replace("|", "/", 1) if "config" in script
                    else module.render() + "a line the parser never wrote\n")
    monkeypatch.setattr(module, "OUT", page)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    assert module.main(["--check"]) == 1
    module.main([])  # writing it makes it current
    assert module.main(["--check"]) == 0


def test_the_config_reference_lists_every_variant_of_a_choice():
    sys.path.insert(0, str(ROOT))
    from relayrl.config import RunConfig

    module = _load("gen_config_reference.py")
    text = (ROOT / "docs" / "reference" / "config.md").read_text()
    choices = {f"{section}.{name}" if section != "run" else name: module.models_in(f.annotation)
               for section, model in [("run", RunConfig), *(
                   (n, m) for n, sf in RunConfig.model_fields.items()
                   for m in module.models_in(sf.annotation))]
               for name, f in model.model_fields.items()
               if len(module.models_in(f.annotation)) > 1}
    assert {"model", "task", "rollout.engine", "trainer.loss"} <= set(choices)
    for where, variants in choices.items():
        for variant in variants:
            assert f"`{where}` ({variant.__name__})" in text, (where, variant.__name__)


def test_a_stale_api_page_fails_the_check(tmp_path, monkeypatch):
    module = _load("gen_api_reference.py")
    grpc, rest = tmp_path / "grpc.md", tmp_path / "rest.md"
    monkeypatch.setattr(module, "PAGES", {grpc: module.render_grpc, rest: module.render_rest})
    monkeypatch.setattr(module, "ROOT", tmp_path)
    module.main([])
    assert module.main(["--check"]) == 0
    rest.write_text(rest.read_text().replace("/v1/stop", "/v1/halt"))
    assert module.main(["--check"]) == 1


def test_the_grpc_reference_names_every_rpc_and_its_comment():
    module = _load("gen_api_reference.py")
    text = module.render_grpc()
    rpcs = re.compile(module.RPC.pattern, re.MULTILINE)
    names = [rpc.group(1) for proto in module.PROTOS.glob("*.proto")
             for rpc in rpcs.finditer("\n".join(line.strip() for line in
                                                proto.read_text().splitlines()))]
    assert {"Submit", "Publish", "AcquireLeases", "Generate"} <= set(names)
    for name in names:
        assert f"| `{name}` |" in text, name
    # a field's comment continued on the next line is kept whole
    assert "0 a tool's or the environment's; empty means all the policy's" in text
