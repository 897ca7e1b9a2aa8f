"""The whole stack under `relayrl up`'s launcher with the control API on: a live settings
change reaches the trainer (its metrics say which bound and temperature each step used), a
temperature no engine can sample at is refused and, left in Redis from before the bound, is
ignored by every service, and a graceful stop ends the run before max_steps with what was
out trained, a last checkpoint, every process exiting cleanly and the books balanced."""

import time

import httpx
import pytest

from relayrl.config import RunConfig
from relayrl.contracts.keys import RunKeys
from relayrl.runtime.redis_conn import connect
from relayrl_ops.launcher import Launcher
from tests.conftest import free_ports, small_stack_config, snapshot
from trainer_svc import checkpoint

pytestmark = pytest.mark.integration
TOKEN = "stop-token"


def test_settings_reach_the_trainer_and_a_graceful_stop_ends_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAYRL_API_TOKEN", TOKEN)
    doc = small_stack_config(tmp_path, steps=1000)
    (rest_port,) = free_ports(1)
    doc["scheduler"].update(max_prompts=0, rest_port=rest_port)
    doc["trainer"].update(checkpoint={"every": 1000})
    doc["eval"] = {"every": 0}
    cfg = RunConfig.model_validate(doc)
    launcher = Launcher(cfg, show_trainer_output=False)
    api = httpx.Client(base_url=f"http://127.0.0.1:{rest_port}",
                       headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    try:
        launcher.start()
        # 1e-300 once crash-looped the workers and made the trainer's weights NaN: refused
        # now, and as left in Redis by an older version, ignored by the workers and trainer
        resp = api.patch("/v1/settings", json={"temperature": 1e-300})
        assert resp.status_code == 422 and resp.json()["detail"][0]["loc"][-1] == "temperature"
        redis = connect(launcher.cfg.redis.url)
        redis.hset(RunKeys(cfg.run_id).live_settings, "temperature", "1e-300")
        def latest_step() -> int:
            return max((r["step"] for r in api.get("/v1/metrics").json()), default=0)

        def dead() -> list[str]:  # the launcher restarts them only when supervising
            return [c.name for c in launcher.children if c.proc.poll() is not None]

        start = latest_step()
        while latest_step() < start + 3:  # on groups sampled while the value was there
            assert not dead(), f"{dead()} died with the stored temperature"
            time.sleep(0.2)
        recent = api.get("/v1/metrics", params={"last": 3}).json()
        assert all(r["control/temperature"] == 1.0 for r in recent), recent
        assert not dead()
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
    assert (cfg.run_path / "checkpoints" / f"step_{step:08d}" / checkpoint.STATE_JSON).is_file()
