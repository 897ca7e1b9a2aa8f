"""`relayrl check CONFIG`, run as a user runs it: the shipped examples pass, and a broken
reward, environment, empty file or over-long prompts fail naming what is wrong."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))
OWN = yaml.safe_load((ROOT / "examples/own_task.yaml").read_text())


def check(config: Path, *sets: str, cwd: Path = ROOT, path: Path | None = None
          ) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        str(p) for p in (ROOT, path) if p is not None)}
    args = [sys.executable, "-m", "relayrl_ops.cli", "check", str(config)]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def own_task(tmp_path: Path, **changes) -> Path:
    """examples/own_task.yaml with `changes` merged into its sections, run from ROOT."""
    data = json.loads(json.dumps(OWN))
    for section, value in changes.items():
        data[section] = {**data.get(section, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@functools.cache
def check_example(name: str) -> subprocess.CompletedProcess:
    """`relayrl check examples/NAME`, run once however many tests read it."""
    return check(ROOT / "examples" / name)


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_shipped_example_passes(example):
    out = check_example(example)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "check: every step passed" in out.stdout
    for heading in ("model: kind", "engine:", "  window:", "  prompts: at most", "task:",
                    "reward:", "memory (rough"):
        assert heading in out.stdout, (heading, out.stdout)


def test_own_task_reports_its_window_rows_and_reward():
    out = check_example("own_task.yaml")
    assert "window: 512 tokens (rollout.engine.max_model_len)" in out.stdout
    assert "prompts: at most 464 tokens" in out.stdout
    assert "rows: 1872 to train on, 128 held out" in out.stdout
    assert "completion '42', reference '-2001' -> 0" in out.stdout


@pytest.mark.parametrize("text", ["", "# a comment, nothing else\n"])
def test_an_empty_config_is_refused(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    out = check(path)
    assert out.returncode == 2
    assert "holds no settings (it is empty or only comments)" in out.stderr


def test_over_long_prompts_are_skipped_and_counted_or_refused(tmp_path):
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    rows += [{"question": "Add these. " + "1 + " * 300 + "1", "answer": "301"}] * 2
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = {"path": str(data), "prompt": {"field": "question"}, "eval_fraction": 0.1,
            "reward": "math_verify"}
    out = check(own_task(tmp_path, task=task))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rows: 18 to train on, 2 held out" in out.stdout
    assert "skipped: 2 row(s): prompt too long" in out.stdout
    # measured with the chat template, against the engine's window less the response
    assert "over the 464 the rollout takes (rollout.engine.max_model_len 512 less " \
           "rollout.max_new_tokens 48)" in out.stderr
    out = check(own_task(tmp_path, task={**task, "long_prompts": "error"}))
    assert out.returncode == 1
    assert "FAILED task: task:" in out.stdout and "row 20: prompt of" in out.stdout


def test_a_reward_that_does_not_import_or_raises_fails(tmp_path):
    out = check(own_task(tmp_path, task={"reward": "no_such_module:score"}))
    assert out.returncode == 1
    assert "FAILED task: task.reward:" in out.stdout and "no_such_module" in out.stdout
    (tmp_path / "broken_reward.py").write_text(textwrap.dedent('''
        def score(completion, reference, metadata):
            return metadata["no_such_column"]
    '''))
    out = check(own_task(tmp_path, task={"reward": "broken_reward:score"}), path=tmp_path)
    assert out.returncode == 1
    assert "FAILED reward on prompt 0" in out.stdout and "KeyError: 'no_such_column'" \
        in out.stdout


def test_an_environment_that_fails_is_reported(tmp_path):
    (tmp_path / "broken_env.py").write_text(textwrap.dedent('''
        from relayrl.plugins.envs.protocol import Environment

        class Broken(Environment):
            def step(self, message):
                return "not a step"
    '''))
    env = {"environment": {"cls": "broken_env:Broken"}}
    out = check(own_task(tmp_path, rollout={**OWN["rollout"], **env}), path=tmp_path)
    assert out.returncode == 1
    assert "environment: broken_env:Broken" in out.stdout
    assert "FAILED Broken.step: Invalid: Broken.step: returned str, not a Step" in out.stdout
    out = check(own_task(tmp_path, rollout={**OWN["rollout"],
                                            "environment": {"cls": "no_such_env:Env"}}))
    assert out.returncode == 1
    assert "FAILED environment: rollout.environment.cls: cannot import 'no_such_env'" \
        in out.stdout
    out = check(own_task(tmp_path, rollout={**OWN["rollout"], "environment": {
        "cls": "calculator"}}))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "step('42'):" in out.stdout


def tiny(tmp_path: Path) -> Path:
    """The tiny model on addition, with no held-out problems (task.eval_size 0)."""
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"run_id": "check_tiny", "run_dir": str(tmp_path / "run"),
                                    "task": {"eval_size": 0}}))
    return path


@pytest.mark.parametrize("sets,failed", [
    ((), "FAILED eval sets: eval.sets 'heldout': its task holds no held-out problems (set "
         "the task's eval_size, eval_path, eval_split or eval_fraction)"),
    (("eval.every=0", "trainer.lora={rank: 4, target_modules: [no_such_module]}"),
     "FAILED trainer.lora: trainer.lora.target_modules ['no_such_module']: "),
    (("eval.every=0", "rollout.engine={kind: vllm, dtype: bfloat16}"),
     "FAILED rollout.engine.dtype: rollout.engine.dtype 'bfloat16' differs from model.dtype "
     "'float32'"),
], ids=["eval-set-without-held-out-problems", "lora-on-missing-modules", "vllm-dtype"])
def test_what_a_service_refuses_at_start_fails_the_check(tmp_path, sets, failed):
    """A setting the trainer or a worker refuses only once it meets the task or the model
    fails the check with the service's own message (exit status 1, no traceback)."""
    out = check(tiny(tmp_path), *sets)
    assert out.returncode == 1, out.stdout + out.stderr
    assert failed in out.stdout and "Traceback" not in out.stdout + out.stderr, out.stdout


def test_eval_sets_are_built_only_where_a_service_evaluates(tmp_path):
    """With eval.every 0 nothing evaluates: a task without held-out problems passes."""
    out = check(tiny(tmp_path), "eval.every=0")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "eval: none (eval.every 0)" in out.stdout
