"""A service that served and then died while others were still loading is restarted by the
launcher's start-up, as it would be during the run: the others may be waiting for it, and
the run goes on to its last step. One that dies before it ever served fails the start with
its name and the end of its log."""

import os
import signal

import pytest

import relayrl_ops.launcher as launcher_mod
from relayrl.config import RunConfig
from relayrl_ops.launcher import Launcher, StartFailed
from tests.conftest import small_stack_config


def _config(tmp_path, **restarts) -> RunConfig:
    data = small_stack_config(tmp_path, steps=4)
    data["restarts"] = {"backoff_s": 0.2, **restarts}
    return RunConfig.model_validate(data)


def test_a_relay_killed_while_a_worker_loads_is_restarted_and_the_run_ends(tmp_path,
                                                                             monkeypatch):
    launcher = Launcher(_config(tmp_path), show_trainer_output=False)
    real_check = launcher_mod.check_health
    killed: list[int] = []

    def child(name):
        return next(c for c in launcher.children if c.name == name)

    def check(address: str) -> bool:
        relay = child("relay")
        if address == relay.address and not killed:
            if not real_check(address):
                return False
            killed.append(relay.proc.pid)  # it served: kill it before the workers are up
            os.kill(relay.proc.pid, signal.SIGKILL)
            return True
        if address == child("rollout-0").address:  # held "loading" until the relay is back
            return (bool(killed) and relay.proc.pid != killed[0]
                    and real_check(relay.address) and real_check(address))
        return real_check(address)

    monkeypatch.setattr(launcher_mod, "check_health", check)
    try:
        launcher.start()
        assert killed and child("relay").proc.pid != killed[0]
        assert child("relay").budget.used == 1
        assert launcher.wait(timeout_s=300) == 0
    finally:
        launcher.shutdown()


def test_a_service_that_dies_before_it_served_fails_the_start(tmp_path, monkeypatch):
    launcher = Launcher(_config(tmp_path), show_trainer_output=False)
    real_check = launcher_mod.check_health

    def check(address: str) -> bool:
        buffer = next(c for c in launcher.children if c.name == "buffer")
        if address == buffer.address:  # it never answers, then dies
            if buffer.proc.poll() is None:
                os.kill(buffer.proc.pid, signal.SIGKILL)
                buffer.proc.wait()
            return False
        return real_check(address)

    monkeypatch.setattr(launcher_mod, "check_health", check)
    try:
        with pytest.raises(StartFailed, match=r"^buffer was killed by SIGKILL.* before serving"):
            launcher.start()
        assert next(c for c in launcher.children if c.name == "buffer").budget.used == 0
    finally:
        launcher.shutdown()
