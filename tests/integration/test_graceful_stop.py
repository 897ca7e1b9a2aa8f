"""The whole stack under `relayrl up`'s launcher with the control API on: a live settings
change reaches the trainer (its metrics say which bound and temperature each step used), and
a graceful stop ends the run before max_steps with what was out trained, a last checkpoint,
every process exiting cleanly and the books balanced."""

import time

import httpx
import pytest

from relayrl.config import RunConfig
from relayrl.launcher import Launcher
from tests.conftest import free_ports, small_stack_config, snapshot

pytestmark = pytest.mark.integration
TOKEN = "stop-token"


def test_settings_reach_the_trainer_and_a_graceful_stop_ends_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAYRL_API_TOKEN", TOKEN)
    doc = small_stack_config(tmp_path, steps=1000)
    (rest_port,) = free_ports(1)
    doc["scheduler"].update(max_prompts=0, rest_port=rest_port)
    doc["trainer"].update(eval_every=0, checkpoint_every=1000)
    cfg = RunConfig.model_validate(doc)
    launcher = Launcher(cfg, show_trainer_output=False)
    api = httpx.Client(base_url=f"http://127.0.0.1:{rest_port}",
                       headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    try:
        launcher.start()
        assert api.patch("/v1/settings", json={"max_staleness": 3, "temperature": 0.8}
                         ).status_code == 200
        seen = []
        while not any(r.get("control/max_staleness") == 3 for r in seen):  # pytest-timeout
            time.sleep(0.2)
            seen = api.get("/v1/metrics", params={"last": 5}).json()
        changed = next(r for r in seen if r.get("control/max_staleness") == 3)
        assert changed["control/temperature"] == 0.8
        assert api.post("/v1/stop").json() == {"state": "stopping"}
        assert launcher.wait() == 0  # the trainer ended on its own, before max_steps
        status = api.get("/v1/status").json()
        audit = snapshot(launcher.cfg)["audit"]
        launcher.shutdown()
        codes = {c.name: c.proc.returncode for c in launcher.children}
    finally:
        api.close()
        launcher.shutdown()
    assert all(code == 0 for code in codes.values()), codes
    run = status["run"]
    assert status["done"] and status["inflight"] == 0 and run["state"] == "stopping"
    assert run["stop_target"] == status["handed_out"] - status["failed"]
    assert audit.balanced, audit.render()
    # everything handed out was trained (or dropped) and acknowledged by the last checkpoint
    assert (audit.counts["in_flight"], audit.counts["awaiting_trainer"]) == (0, 0)
    assert audit.counts["trainer_finished"] == run["stop_target"]
    step = run["trainer_step"]
    assert 0 < step < 1000
    assert (cfg.run_path / "checkpoints" / f"step_{step:08d}" / "trainer_state.pt").is_file()
