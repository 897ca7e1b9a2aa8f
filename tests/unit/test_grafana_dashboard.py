"""deploy/grafana/relayrl.json: every metric its queries name is one the services export (the
list comes from the exporter tables), every panel reads the Prometheus data-source variable,
and the figures an operator needs first each have a panel."""

import json
import re
from pathlib import Path

import pytest

from tests.unit.exported import SAMPLE_NAMES

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "relayrl.json"
METRIC = re.compile(r"\brelayrl_[a-zA-Z0-9_]+")


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def graph_panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out += panel.get("panels", []) if panel["type"] == "row" else [panel]
    return out


def named(dashboard: dict) -> dict[str, set[str]]:
    """{panel title: metric names its queries use}"""
    return {p["title"]: {m for t in p["targets"] for m in METRIC.findall(t["expr"])}
            for p in graph_panels(dashboard)}


def test_every_queried_metric_is_exported(dashboard):
    for title, metrics in named(dashboard).items():
        assert metrics, f"panel {title!r} queries no relayrl metric"
        assert metrics <= SAMPLE_NAMES, f"panel {title!r}: {sorted(metrics - SAMPLE_NAMES)}"


def test_panels_read_the_datasource_variable(dashboard):
    (var,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert var["query"] == "prometheus"
    ref = f"${{{var['name']}}}"
    ids = [p["id"] for p in dashboard["panels"]]
    ids += [q["id"] for p in dashboard["panels"] for q in p.get("panels", [])]
    assert len(ids) == len(set(ids))
    for panel in graph_panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": ref}, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]


def test_the_main_figures_have_panels(dashboard):
    used = set().union(*named(dashboard).values())
    for metric in ("relayrl_train_reward_mean", "relayrl_throughput_samples_per_second",
                   "relayrl_rollout_tokens_generated_total", "relayrl_staleness_lag_mean",
                   "relayrl_weights_publish_stall_seconds", "relayrl_weights_pull_seconds",
                   "relayrl_scheduler_leases_active", "relayrl_scheduler_leases_expired_total",
                   "relayrl_scheduler_leases_recalled_total",
                   "relayrl_buffer_trajectory_stream_len", "relayrl_buffer_batch_stream_len"):
        assert metric in used, metric
