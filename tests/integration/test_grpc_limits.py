"""What a service's gRPC server takes in: a real scheduler process refuses a message over its
receive limit (sized from scheduler.max_partial_state_bytes) with RESOURCE_EXHAUSTED before
its handler sees it, and a server holding its max_concurrent_rpcs refuses the next call
before running it, a refusal the run's clients wait out and retry."""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent import futures

import grpc
import pytest
import yaml

from relayrl.config import RunConfig
from relayrl.contracts.proto.v1 import scheduler_pb2, scheduler_pb2_grpc
from relayrl.runtime.grpc_util import channel, free_ports, make_server, wait_healthy
from relayrl.runtime.outage import is_busy, is_outage, is_too_large

pytestmark = pytest.mark.integration
STATE_LIMIT = 4096  # scheduler.max_partial_state_bytes: the receive limit is this + 1 MiB


@pytest.fixture
def scheduler(tmp_path):
    (port,) = free_ports(1)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({
        "run_dir": str(tmp_path / "run"), "auth": {"required": False},
        "scheduler": {"endpoint": {"port": port}, "max_partial_state_bytes": STATE_LIMIT}}))
    proc = subprocess.Popen([sys.executable, "-m", "scheduler_svc", "--config", str(path)],
                            stderr=subprocess.PIPE, text=True)
    address = f"127.0.0.1:{port}"
    try:
        wait_healthy(address, 120, alive=lambda: proc.poll() is None)
        yield address
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert "Traceback" not in err, err[-2000:]


def test_a_message_over_the_schedulers_limit_is_refused_by_grpc(scheduler):
    limit = RunConfig.model_validate(
        {"scheduler": {"max_partial_state_bytes": STATE_LIMIT}}).scheduler.grpc_receive_bytes
    assert limit == STATE_LIMIT + (1 << 20)
    with channel(scheduler, max_message_bytes=64 << 20) as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.SaveProgress(scheduler_pb2.SaveProgressRequest(
                worker_id="w0", lease_id="l0", state=b"x" * (2 << 20)), timeout=30)
        err = info.value
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
        assert f"vs. {limit})" in err.details(), err.details()
        assert is_too_large(err) and not is_outage(err)  # sent again, refused again
        # one under the limit reaches the handler: no such lease
        assert not stub.SaveProgress(scheduler_pb2.SaveProgressRequest(
            worker_id="w0", lease_id="l0", state=b"x" * (1 << 20)), timeout=30).accepted


class BlockingScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Heartbeat holds each call until `release` is set."""

    def __init__(self):
        self.inside = threading.Semaphore(0)
        self.release = threading.Event()

    def Heartbeat(self, request, context):
        self.inside.release()
        self.release.wait(30)
        return scheduler_pb2.HeartbeatResponse(known=True)


def test_a_call_past_the_concurrency_limit_is_refused_and_worth_retrying():
    limit = 2
    (port,) = free_ports(1)
    servicer = BlockingScheduler()
    server, _ = make_server(f"127.0.0.1:{port}",
                            [(scheduler_pb2_grpc.add_SchedulerServicer_to_server, servicer)],
                            max_concurrent_rpcs=limit)
    server.start()
    pool = futures.ThreadPoolExecutor(limit)
    try:
        with channel(f"127.0.0.1:{port}") as ch:
            beat = scheduler_pb2_grpc.SchedulerStub(ch).Heartbeat
            held = [pool.submit(beat, scheduler_pb2.HeartbeatRequest(worker_id=f"w{i}"),
                                timeout=30) for i in range(limit)]
            for _ in range(limit):
                assert servicer.inside.acquire(timeout=30)
            with pytest.raises(grpc.RpcError) as info:
                beat(scheduler_pb2.HeartbeatRequest(worker_id="one-too-many"), timeout=30)
            err = info.value
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            assert is_busy(err) and is_outage(err) and not is_too_large(err)
            servicer.release.set()
            assert all(f.result(timeout=30).known for f in held)
            # the limit freed, the same call goes through
            assert beat(scheduler_pb2.HeartbeatRequest(worker_id="one-too-many"),
                        timeout=30).known
    finally:
        servicer.release.set()
        pool.shutdown()
        server.stop(0)
