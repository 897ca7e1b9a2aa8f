"""Every service's real entry point refuses a bad config before it imports its engine or
binds a port: exit status 2, the offending field named on stderr, no traceback. A valid file
that a service refuses only once it meets the machine or the data (a ConfigError at start-up)
ends it the same way."""

import os
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.integration

SERVICES = ["buffer_svc", "relay_svc", "rollout_svc", "scheduler_svc", "trainer_svc", "eval_svc"]
BAD = [  # (config document, override, what stderr must name)
    ({"trainer": {"optimizer": {"lr": "fast"}}}, None, "trainer.optimizer.lr"),
    ({"rollout": {"num_workers": 0}}, None, "rollout.num_workers"),
    ({"scheduler": {"lease_ttl_s": -1}}, None, "scheduler.lease_ttl_s"),
    ({"buffer": {"no_such_field": 1}}, None, "buffer.no_such_field"),
    ({}, "relay.endpoint.port=99999", "relay.endpoint.port"),
    ("trainer: [unclosed", None, "not valid YAML"),
]


@pytest.mark.parametrize("service", SERVICES)
def test_a_bad_config_is_refused_by_name(tmp_path, service):
    for i, (doc, override, named) in enumerate(BAD):
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
        argv = [sys.executable, "-m", service, "--config", str(path)]
        if override:
            argv += ["--set", override]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (service, named, proc.stderr[-2000:])
        assert named in proc.stderr, (service, proc.stderr)
        assert "Traceback" not in proc.stderr, (service, proc.stderr)


MISSING = "/nonexistent/relayrl"
NO_TOKEN = "RELAYRL_TEST_UNSET_REST_TOKEN"
REFUSED_AT_START = [  # (service, config document, what stderr must name)
    ("relay_svc", {"relay": {"shm_dir": MISSING}}, f"relay.shm_dir '{MISSING}' is not a"),
    ("scheduler_svc", {"scheduler": {"rest_port": 1, "rest_token_env": NO_TOKEN}},
     f"scheduler.rest_port is set but ${NO_TOKEN} is empty"),
    # no CUDA, or fewer than 16 GPUs
    ("trainer_svc", {"trainer": {"device": "cuda:15"}}, "trainer.device: 'cuda:15'"),
    ("rollout_svc", {"task": {"reward": "no_such_reward"}}, "task.reward: "),
    ("eval_svc", {"eval": {"mode": "inline"}}, "eval.mode is 'inline'"),
    ("eval_svc", {"eval": {"mode": "separate", "device": "cuda:15"}}, "eval.device: 'cuda:15'"),
]


@pytest.mark.parametrize("service, doc, named", REFUSED_AT_START,
                         ids=[s for s, _, _ in REFUSED_AT_START])
def test_a_setting_refused_at_start_up_ends_the_service_as_a_bad_file_does(
        tmp_path, service, doc, named):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), "auth": {"required": False},
                                    **doc}))
    env = {k: v for k, v in os.environ.items() if k != NO_TOKEN}
    proc = subprocess.run([sys.executable, "-m", service, "--config", str(path)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, (service, proc.stderr[-2000:])
    assert named in proc.stderr, (service, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, (service, proc.stderr[-2000:])
