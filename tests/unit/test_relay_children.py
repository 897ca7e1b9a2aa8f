"""`relay.children`: the relay tree `relayrl up` starts. Each child follows the root on a port
of its own, every worker pulls from its child first and the root second, and a child sees
no trainer token (it publishes nothing)."""

import pytest
import yaml

from relayrl.config import ConfigError, RunConfig, load_run_config
from relayrl.config.base import load_model
from relayrl_ops.launcher import PUBLISH_PARTIES, Launcher


def config(**relay) -> RunConfig:
    return RunConfig.model_validate({
        "relay": {"endpoint": {"host": "127.0.0.1", "port": 51551}, "children_base_port": 51540,
                  **relay},
        "rollout": {"num_workers": 3}})


def test_workers_pull_from_their_child_then_the_root():
    cfg = config(children=2)
    assert cfg.child_relay_addresses == ["127.0.0.1:51540", "127.0.0.1:51541"]
    worker = [cfg.model_copy(update={"rollout": cfg.rollout.model_copy(
        update={"worker_index": i})}).relay_addresses for i in range(3)]
    assert worker == [["127.0.0.1:51540", "127.0.0.1:51551"],
                      ["127.0.0.1:51541", "127.0.0.1:51551"],
                      ["127.0.0.1:51540", "127.0.0.1:51551"]]


def test_without_children_workers_pull_from_the_root_and_named_relays_win():
    assert config().relay_addresses == ["127.0.0.1:51551"]
    named = config(children=2).model_copy(update={"rollout": config().rollout.model_copy(
        update={"relays": ["elsewhere:1"]})})
    assert named.relay_addresses == ["elsewhere:1"]


def test_a_child_port_taken_by_another_server_is_refused():
    with pytest.raises(ValueError, match=r"child relay 1 .* port 51551"):
        config(children=2, children_base_port=51550)


def test_the_launcher_starts_children_that_follow_the_root(tmp_path):
    cfg = config(children=2).model_copy(update={"run_dir": str(tmp_path)})
    children = [c.process for c in Launcher(cfg)._children() if c.name.startswith("relay-")]
    assert [c.name for c in children] == ["relay-child-0", "relay-child-1"]
    assert not {c.name for c in children} & set(PUBLISH_PARTIES)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    for child, address in zip(children, cfg.child_relay_addresses, strict=True):
        assert child.module == "relay_svc" and child.address == address
        own = load_run_config(path, list(child.overrides))  # what the child process parses
        assert own.relay.endpoint.address == address
        assert own.relay.upstream == [cfg.relay.endpoint.address]
        assert own.relay.children == 0 and own.relay.metrics_port == 0


@pytest.mark.parametrize("children", [-1, 65])
def test_a_child_count_out_of_range_is_refused_by_name(children):
    with pytest.raises(ConfigError, match="relay.children"):
        load_model(RunConfig, {"relay": {"children": children}}, "test")


def test_a_launcher_warns_of_settings_under_which_its_run_never_ends(tmp_path, caplog):
    cfg = RunConfig.model_validate({
        "run_dir": str(tmp_path), "rollout": {"num_workers": 1},
        "scheduler": {"start_after_workers": 2, "max_prompts": 20},
        "buffer": {"groups_per_batch": 8}, "trainer": {"max_steps": 3}})
    Launcher(cfg)._warn_of_settings_that_stall()
    assert "start_after_workers is 2 and this launcher starts 1" in caplog.text
    assert "max_prompts is 20 and trainer.max_steps 3 needs 24 groups" in caplog.text
    assert "waits after step 2" in caplog.text
    caplog.clear()
    enough = RunConfig.model_validate({
        "run_dir": str(tmp_path), "rollout": {"num_workers": 2},
        "scheduler": {"start_after_workers": 2, "max_prompts": 24},
        "buffer": {"groups_per_batch": 8}, "trainer": {"max_steps": 3}})
    Launcher(enough)._warn_of_settings_that_stall()
    assert caplog.text == ""
