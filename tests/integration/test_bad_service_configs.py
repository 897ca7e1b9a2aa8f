"""Every service's real entry point refuses a bad config before it imports its engine or
binds a port: exit status 2, the offending field named on stderr, no traceback."""

import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.integration

SERVICES = ["buffer_svc", "relay_svc", "rollout_svc", "scheduler_svc", "trainer_svc"]
BAD = [  # (config document, override, what stderr must name)
    ({"trainer": {"lr": "fast"}}, None, "trainer.lr"),
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
