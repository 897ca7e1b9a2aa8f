from pathlib import Path

import pytest
import yaml

from relayrl.config import ConfigError, RunConfig, load_run_config
from relayrl.config.base import apply_overrides

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted([*ROOT.glob("examples/*.yaml"), *ROOT.glob("deploy/**/*.yaml")])
# run configs, not Kubernetes manifests (test_deploy checks the config a ConfigMap carries)
SHIPPED = [p for p in SHIPPED
           if "run_id" in p.read_text() and "kind" not in (yaml.safe_load(p.read_text()) or {})]


def test_there_are_shipped_configs():
    assert any(p.parent.name == "examples" for p in SHIPPED)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_loads(path):
    cfg = load_run_config(path)
    assert cfg.rollout.samples_per_prompt == cfg.buffer.group_size


def write(tmp_path, data):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("data,field", [
    ({"trainer": {"lr": -1}}, "trainer.lr"),
    ({"trainer": {"max_steps": "many"}}, "trainer.max_steps"),
    ({"rollout": {"temperature": 0}}, "rollout.temperature"),
    ({"buffer": {"group_size": 3}}, "rollout.samples_per_prompt"),
    ({"trainer": {"bogus": 1}}, "trainer.bogus"),
    ({"relay": {"endpoint": {"port": 70000}}}, "relay.endpoint.port"),
    ({"scheduler": {"endpoint": {"port": 50551}}}, "port 50551"),
    ({"buffer": {"metrics_port": 50554}}, "buffer.metrics_port and trainer.endpoint.port"),
    ({"relay": {"metrics_port": 9100}, "rollout": {"metrics_base_port": 9099}},
     r"rollout worker 1 metrics \(rollout.metrics_base_port\+1\) and relay.metrics_port"),
    ({"run_id": "has space"}, "run_id"),
    ({"task": {"name": "chess"}}, "task.name"),
    ({"task": {"prompt_format": "chat"}}, "task.prompt_format"),
    ({"model": {"path": "/m", "pretrained": "smollm2-135m-instruct"}}, "model.path"),
    ({"model": {"pretrained": "gpt-5"}}, "model.pretrained"),
    ({"rollout": {"engine": "vllm"}, "model": {"hidden_size": 64, "num_heads": 4}},
     "rollout.engine 'vllm' cannot run the tiny model's head size 16"),
])
def test_bad_configs_name_the_field(tmp_path, data, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_run_config(write(tmp_path, data))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_run_config(tmp_path / "nope.yaml")


def test_overrides_apply_and_validate(tmp_path):
    cfg = load_run_config(write(tmp_path, {}), ["trainer.lr=0.01", "rollout.num_workers=3"])
    assert cfg.trainer.lr == 0.01 and cfg.rollout.num_workers == 3
    with pytest.raises(ConfigError, match="trainer.lr"):
        load_run_config(write(tmp_path, {}), ["trainer.lr=-3"])
    with pytest.raises(ConfigError, match="section.field=value"):
        apply_overrides({}, ["no_equals_sign"])


@pytest.mark.parametrize("staleness,batches", [(0, 1), (1, 2), (2, 2), (3, 3), (8, 8)])
def test_inflight_limit_follows_batch_and_staleness(staleness, batches):
    """One batch out at staleness 0 (synchronous), two at least with any staleness (so
    generation overlaps training), else as many as the bound."""
    cfg = RunConfig.model_validate({"buffer": {"groups_per_batch": 4},
                                    "trainer": {"max_staleness": staleness}})
    assert cfg.inflight_limit == 4 * batches
