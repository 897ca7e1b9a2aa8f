"""Every service's /metrics and /healthz: the relay, scheduler and buffer as real processes
with metrics on, and a rollout worker in this process that leases from that scheduler, pulls
from that relay and writes to that buffer. One lease later each /metrics shows the figures it
must, under hierarchical names, and /healthz answers 200 while serving and 503 after."""

import subprocess
import sys
import time

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from relayrl.config import RunConfig
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.leases import GrpcLeaseClient
from relayrl.contracts.streams import TrajectoryWriter
from relayrl.runtime.auth import install_launcher_credentials
from relayrl.runtime.exporter import MetricsEndpoint
from relayrl.runtime.grpc_util import check_health
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from relayrl_torch.models.loading import load_model
from relayrl_torch.weights.client import RelayClient
from relayrl_torch.weights.signing import ManifestKeys
from rollout_svc.engines.torch import TorchEngine
from rollout_svc.serving.batcher import RequestBatcher
from rollout_svc.telemetry import rollout_metrics
from rollout_svc.worker import RolloutWorker
from tests.conftest import free_ports

GROUP = 4
SERVICES = ("relay", "scheduler", "buffer")


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one /metrics page."""
    resp = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(resp.text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    found = [v for (n, lbls), v in samples.items()
             if n == name and labels.items() <= dict(lbls).items()]
    assert len(found) == 1, f"{name} {labels}: {found}"
    return found[0]


@pytest.fixture
def services(tmp_path):
    server = EmbeddedRedis(tmp_path)
    ports = free_ports(7)
    data = {
        "run_id": "obs", "run_dir": str(tmp_path / "run"), "redis": {"url": server.url},
        "task": {"digits": 1, "eval_size": 4},
        "relay": {"endpoint": {"port": ports[0]}, "metrics_port": ports[1],
                  "data_planes": ["grpc"]},
        "scheduler": {"endpoint": {"port": ports[2]}, "metrics_port": ports[3]},
        "buffer": {"endpoint": {"port": ports[4]}, "metrics_port": ports[5], "group_size": GROUP,
                   "groups_per_batch": 1},
        "rollout": {"max_new_tokens": 3, "metrics_base_port":
                    ports[6]},
    }
    cfg = RunConfig.model_validate(data)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    install_launcher_credentials(cfg.auth)  # the services inherit the run's token, as from up
    procs = {name: subprocess.Popen([sys.executable, "-m", f"{name}_svc", "--config", str(path)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name in SERVICES}
    try:
        deadline = time.monotonic() + 120
        for name in SERVICES:
            while not check_health(getattr(cfg, name).endpoint.address):
                assert procs[name].poll() is None, f"{name}_svc exited"
                assert time.monotonic() < deadline, f"{name}_svc did not come up"
                time.sleep(0.2)
        yield cfg, procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=30)
        server.shutdown()


def test_every_service_exports_its_figures_and_health(services, tiny_lm):
    cfg, procs = services
    # this process publishes as the trainer would, with the run's key pair from the environment
    relay = RelayClient(cfg.relay.endpoint.address, keys=ManifestKeys.from_config(cfg.auth))
    relay.publish(1, 1, tiny_lm.model.state_dict())
    lm = load_model(tiny_lm.path)
    engine = TorchEngine(lm, seed=0)
    worker = RolloutWorker(cfg.rollout_part(), engine, lm,
                           GrpcLeaseClient(cfg.scheduler.endpoint.address),
                           [relay], TrajectoryWriter(connect(cfg.redis.url), RunKeys("obs"),
                                                     cfg.buffer.max_pending_samples),
                           "exact_match")
    assert worker.refresh_weights()
    worker.register()
    lease = worker.scheduler.acquire(worker.worker_id, 1).leases[0]
    assert worker.run_lease(lease)
    endpoint = MetricsEndpoint(worker.worker_id, "127.0.0.1", cfg.rollout.metrics_port,
                               rollout_metrics(worker, RequestBatcher(engine)), lambda: True)
    endpoint.start()
    try:
        rollout = scrape(cfg.rollout.metrics_port)
    finally:
        endpoint.stop()
    labels = {"service": "rollout", "worker_id": "rollout-0"}
    assert value(rollout, "relayrl_rollout_samples_generated_total", **labels) == GROUP
    assert value(rollout, "relayrl_rollout_tokens_generated_total", **labels) >= GROUP
    assert value(rollout, "relayrl_rollout_tokens_per_second", **labels) > 0
    assert value(rollout, "relayrl_rollout_policy_version", **labels) == 1
    # one group of GROUP sequences: every engine call extended all of them that were unfinished
    calls = value(rollout, "relayrl_rollout_segments_total", **labels)
    assert GROUP <= value(rollout, "relayrl_rollout_segment_sequences_total", **labels) <= (
        GROUP * calls)
    assert value(rollout, "relayrl_rollout_seats", **labels) == (
        cfg.rollout.max_active_groups * GROUP)
    assert value(rollout, "relayrl_rollout_loop_seconds_total", part="generate", **labels) > 0
    assert value(rollout, "relayrl_weights_swaps_total", **labels) == 1
    assert 0 < value(rollout, "relayrl_weights_pull_seconds", **labels) < 60
    assert value(rollout, "relayrl_weights_bytes_pulled_total", **labels) > 0

    relay_m = scrape(cfg.relay.metrics_port)
    assert value(relay_m, "relayrl_relay_latest_version", service="relay") == 1
    assert value(relay_m, "relayrl_relay_versions_published_total") == 1
    assert value(relay_m, "relayrl_relay_pulls_served_total") == 1

    deadline = time.monotonic() + 30  # the buffer batches the group on its own schedule
    while value(buffer := scrape(cfg.buffer.metrics_port),
                "relayrl_buffer_batches_emitted_total") < 1:
        assert time.monotonic() < deadline, buffer
        time.sleep(0.2)
    assert value(buffer, "relayrl_buffer_samples_read_total", service="buffer") == GROUP
    assert value(buffer, "relayrl_buffer_groups_assembled_total") == 1
    assert value(buffer, "relayrl_buffer_batch_stream_len") == 1
    assert value(buffer, "relayrl_buffer_trajectory_stream_len") == 0

    sched = scrape(cfg.scheduler.metrics_port)
    assert value(sched, "relayrl_scheduler_leases_granted_total", service="scheduler") == 1
    assert value(sched, "relayrl_scheduler_leases_completed_total") == 1
    assert value(sched, "relayrl_scheduler_leases_active") == 0
    assert value(sched, "relayrl_scheduler_workers") == 1
    assert value(sched, "relayrl_scheduler_worker_leases", worker="rollout-0") == 0
    assert value(sched, "relayrl_scheduler_redis_oom_refusals_total") == 0
    assert value(sched, "relayrl_scheduler_inflight_limit") == cfg.inflight_limit

    for name in SERVICES:
        port = getattr(cfg, name).metrics_port
        samples = scrape(port)
        assert value(samples, "relayrl_service_up", service=name) == 1
        assert value(samples, "relayrl_service_uptime_seconds", service=name) > 0
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200

    # SIGTERM: NOT_SERVING through the drain, and the port closes with the process
    procs["relay"].terminate()
    assert procs["relay"].wait(timeout=30) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{cfg.relay.metrics_port}/healthz", timeout=5)


def test_healthz_is_503_until_serving(tmp_path):
    (port,) = free_ports(1)
    serving = False
    endpoint = MetricsEndpoint("probe", "127.0.0.1", port, None, lambda: serving)
    endpoint.start()
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 503
        assert value(scrape(port), "relayrl_service_up", service="probe") == 0
        serving = True
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        assert value(scrape(port), "relayrl_service_up", service="probe") == 1
    finally:
        endpoint.stop()
