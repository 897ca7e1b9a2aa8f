"""How the launcher says a service ended: an exit code as it is, a signal by name, and a
SIGKILL with where it most likely came from (the kernel's out-of-memory killer)."""

import signal

from relayrl_ops.launcher import ended_by


def test_an_exit_code_is_said_as_it_is():
    assert ended_by(2) == "exited with code 2"
    assert ended_by(0) == "exited with code 0"


def test_a_signal_is_named():
    assert ended_by(-signal.SIGTERM) == "was killed by SIGTERM"
    assert ended_by(-200) == "was killed by signal 200"


def test_a_sigkill_points_at_the_memory_plan():
    said = ended_by(-signal.SIGKILL)
    assert said.startswith("was killed by SIGKILL")
    assert "out-of-memory" in said and "relayrl check" in said
