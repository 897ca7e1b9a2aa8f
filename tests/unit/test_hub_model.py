"""`model.path` takes a hub id as well as a directory: the snapshot is found in the Hugging
Face cache as the hub lays it out (here offline, from a cache built by hand)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relayrl.config import RunConfig

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, repo: str, model_dir: Path) -> Path:
    """`root` laid out as huggingface_hub's cache holding `repo` at `main`: the snapshot."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    snapshot = folder / "snapshots" / COMMIT
    shutil.copytree(model_dir, snapshot)
    return snapshot


def resolve(path: str, cache: Path) -> subprocess.CompletedProcess:
    code = ("import sys; from relayrl.config import RunConfig; "
            "cfg = RunConfig.model_validate({'model': {'kind': 'hf', 'path': sys.argv[1]}, "
            "'task': {'source': 'addition'}}); "
            "print(cfg.model.directory()); print(cfg.model.limits().vocab_size)")
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_hub_id_resolves_to_its_cached_snapshot(tmp_path, tiny_lm):
    snapshot = hub_cache(tmp_path / "hub", "acme/tiny-adder", Path(tiny_lm.path))
    for name in ("acme/tiny-adder", "acme/tiny-adder@main"):
        out = resolve(name, tmp_path / "hub")
        assert out.returncode == 0, out.stderr
        directory, vocab = out.stdout.split()
        assert Path(directory) == snapshot
        assert int(vocab) == tiny_lm.model.config.vocab_size


def test_a_hub_id_missing_from_an_offline_cache_is_refused_by_name(tmp_path):
    out = resolve("acme/absent", tmp_path / "hub")
    assert out.returncode != 0
    assert "model.path: 'acme/absent' is not a directory" in out.stderr


def test_a_directory_is_taken_as_it_is(tiny_lm):
    cfg = RunConfig.model_validate({"model": {"kind": "hf", "path": str(tiny_lm.path)},
                                    "task": {"source": "addition"}})
    assert cfg.model.directory() == Path(tiny_lm.path)


@pytest.mark.parametrize("path", ["/no/such/dir", "a/b/c", "just-a-name"])
def test_what_is_neither_a_directory_nor_a_hub_id_stays_a_path(path):
    cfg = RunConfig.model_validate({"model": {"kind": "hf", "path": path},
                                    "task": {"source": "addition"}})
    assert cfg.model.directory() == Path(path)
