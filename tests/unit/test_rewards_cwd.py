"""User reward modules import from the working directory, as `python -m` would."""

import pytest

pytestmark = pytest.mark.unit


def test_a_reward_module_under_the_working_directory_imports_from_a_console_script(
        tmp_path, monkeypatch):
    """`relayrl eval`/`relayrl up` run as console scripts, whose sys.path lacks the working
    directory that `python -m` adds: a user's reward beside the config must still import."""
    import sys

    from relayrl_tasks.rewards import get_reward, score

    (tmp_path / "cwd_reward_mod.py").write_text(
        "def check(completion, reference):\n    return float(completion == reference)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert score(get_reward("cwd_reward_mod:check"), "7", "7") == (1.0, "")
