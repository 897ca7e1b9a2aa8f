"""The agents guide's commands run as written: each ```bash block of
docs/guides/environments.md that follows a `<!-- guide-test -->` comment is run, line for
line, by `bash -e` in a fresh copy of the repository (its tracked and unignored files), so it
starts a real stack with `relayrl up`, waits for it, reads the tokens the run made, plays an
agent's episodes against the worker's OpenAI-compatible server and stops the run. A command
that fails, an agent that is refused its token, or a run that ends with an error fails the
test; so does a block that leaves no agent output.

The copy shares the test's virtual environment (`.venv`) and the checkout's model cache
(`.cache/relayrl/models`), as a clone after `make install` and a first run would have them.
The blocks use the examples' own ports, so one guide run at a time holds them (a lock), and
a port another program holds fails the test naming it before anything starts."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from relayrl.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs/guides/environments.md"
MARKED = re.compile(r"<!-- guide-test -->\s*\n```bash\n(.*?)\n```", re.S)
BLOCK_TIMEOUT_S = 240  # only stops a broken block from hanging the suite
ROLE_VARS = ("RELAYRL_TOKEN", "RELAYRL_AGENT_TOKEN", "RELAYRL_OPERATOR_TOKEN",
             "RELAYRL_TRAINER_TOKEN", "RELAYRL_SIGNING_KEY", "RELAYRL_VERIFY_KEY",
             "RELAYRL_API_TOKEN", "RELAYRL_API_URL")


def guide_blocks() -> list[str]:
    blocks = MARKED.findall(GUIDE.read_text())
    assert blocks, f"no ```bash block after <!-- guide-test --> in {GUIDE}"
    return blocks


def block_config(block: str) -> RunConfig:
    """The run config the block's `relayrl up` starts, its --set overrides applied."""
    up = re.search(r"relayrl up (\S+)((?:\s+\\?\s*--set \S+)*)", block)
    assert up, f"no `relayrl up <config>` in the block:\n{block}"
    data = yaml.safe_load((ROOT / up.group(1)).read_text())
    for setting in re.findall(r"--set (\S+)", up.group(2)):
        dotted, value = setting.split("=", 1)
        *path, last = dotted.split(".")
        node = data
        for key in path:
            node = node.setdefault(key, {})
        node[last] = yaml.safe_load(value)
    return RunConfig.model_validate(data)


def ports_of(cfg: RunConfig) -> set[int]:
    """Every port the run binds: each `*port` field, a worker's for each worker."""
    workers = cfg.rollout.num_workers
    found: set[int] = set()

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
                        and key.endswith("port"):
                    span = workers if key.endswith("base_port") else 1
                    found.update(range(value, value + span))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(cfg.model_dump(mode="json"))
    return found


def held(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A fresh copy of the repository, with the test's venv and the checkout's model cache."""
    out = tmp_path_factory.mktemp("guide") / "relayrl"
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out / name)
    (out / ".venv").symlink_to(sys.prefix)  # the venv running the tests
    assert (out / ".venv/bin/relayrl").is_file(), f"no relayrl command in {sys.prefix}/bin"
    cache = ROOT / ".cache/relayrl/models"
    cache.mkdir(parents=True, exist_ok=True)
    (out / ".cache/relayrl").mkdir(parents=True)
    (out / ".cache/relayrl/models").symlink_to(cache)
    return out


def readable(output: str) -> str:
    """The output without its progress bars (the trainer's, redrawn with carriage returns)."""
    lines = (line.rsplit("\r", 1)[-1] for line in output.splitlines())
    return "\n".join(line for line in lines if not re.search(r"(it|seq)/s", line))


def run_block(block: str, cwd: Path) -> str:
    """The block run by `bash -e` in `cwd`: its output; the test fails on a non-zero exit.
    Whatever it left running (its `relayrl up`, when a later command failed) is stopped
    once bash has ended."""
    env = {k: v for k, v in os.environ.items() if k not in ROLE_VARS}
    env["PYTHONPATH"] = str(cwd)  # the copy's code, whichever checkout the venv was built in
    script, log = cwd / "guide_block.sh", cwd / "guide_block.log"
    script.write_text(block + "\n")
    with open(log, "w") as out:  # a file, not a pipe: a process left behind holds no EOF
        proc = subprocess.Popen(["bash", "-e", str(script)], cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                time.sleep(5)
    raw = log.read_text(errors="replace")
    text = readable(raw)
    assert code is not None, f"the block ran past {BLOCK_TIMEOUT_S} s:\n{block}\n{text[-4000:]}"
    assert code == 0, f"exit {code}:\n{block}\n{text[-6000:]}"
    return raw


@pytest.mark.parametrize("index", range(len(guide_blocks())))
def test_a_guide_block_runs_as_written(index, clone):
    block = guide_blocks()[index]
    cfg = block_config(block)
    if cfg.rollout.engine.kind == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip("the block's config generates with vLLM, which is not installed")
    lock_path = Path(tempfile.gettempdir()) / "relayrl-guide-ports.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the examples' ports: one guide run at a time
        busy = sorted(p for p in ports_of(cfg) if held(p))
        assert not busy, f"ports the guide's run uses are held by another program: {busy}"
        out = run_block(block, clone)
    assert "mean reward" in out, readable(out)[-4000:]  # the agent's line for each group
