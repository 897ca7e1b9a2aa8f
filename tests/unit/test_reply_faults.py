"""The lost-reply fault schedule (relayrl.runtime.reply_faults): off unless asked for, strict about
its setting, the same faults for the same seed, and a dropped reply's call carried out."""

import grpc
import pytest

from relayrl.contracts.proto.v1 import scheduler_pb2, scheduler_pb2_grpc
from relayrl.runtime.grpc_util import channel, make_server
from relayrl.runtime.reply_faults import (
    DROP,
    ENV,
    LATE,
    FaultSchedule,
    ReplyFaults,
    with_lost_replies,
)
from tests.conftest import free_ports


def test_off_unless_the_environment_asks(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    servicer = object()
    assert ReplyFaults.from_env() is None
    assert with_lost_replies(servicer, "Scheduler", ["Heartbeat"]) is servicer
    monkeypatch.setenv(ENV, "7,0.1,0.05")
    assert ReplyFaults.from_env() == ReplyFaults(7, 0.1, 0.05)


@pytest.mark.parametrize("text, named", [("7", "seed,drop,late"), ("x,0.1,0", "seed,drop,late"),
                                         ("1,0.9,0", "drop share 0.9"),
                                         ("1,0,nan", "late share nan"),
                                         ("1,-0.1,0", "drop share -0.1")])
def test_a_bad_setting_is_refused_naming_it(text, named):
    with pytest.raises(ValueError, match=ENV) as info:
        ReplyFaults.parse(text)
    assert named in str(info.value)


def test_the_same_seed_gives_the_same_faults_per_method():
    def draws(seed, method):
        schedule = FaultSchedule(ReplyFaults(seed, 0.3, 0.2), "Scheduler")
        return [schedule.next(method)[0] for _ in range(200)]

    assert draws(3, "Complete") == draws(3, "Complete")
    assert draws(3, "Complete") != draws(4, "Complete")
    assert draws(3, "Complete") != draws(3, "Release")
    faults = draws(3, "Complete")
    assert {DROP, LATE, ""} == set(faults)


class Counting(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self):
        self.beats = 0

    def Heartbeat(self, request, context):
        self.beats += 1
        return scheduler_pb2.HeartbeatResponse(known=True)


def test_a_dropped_or_late_reply_comes_after_the_work_was_done():
    faults = ReplyFaults(11, 0.3, 0.3)
    expected = FaultSchedule(faults, "Scheduler")
    inner = Counting()
    (port,) = free_ports(1)
    server, _ = make_server(f"127.0.0.1:{port}", [(
        scheduler_pb2_grpc.add_SchedulerServicer_to_server,
        with_lost_replies(inner, "Scheduler", ["Heartbeat"], faults))])
    server.start()
    try:
        stub = scheduler_pb2_grpc.SchedulerStub(channel(f"127.0.0.1:{port}"))
        seen, faults_due = [], []
        for n in range(1, 9):
            faults_due.append(expected.next("Heartbeat")[0])
            try:
                assert stub.Heartbeat(scheduler_pb2.HeartbeatRequest(worker_id="w"),
                                      timeout=0.5).known
                seen.append("")
            except grpc.RpcError as err:
                seen.append({grpc.StatusCode.UNAVAILABLE: DROP,
                             grpc.StatusCode.DEADLINE_EXCEEDED: LATE}[err.code()])
            assert inner.beats == n  # carried out, whatever the caller saw
        assert seen == faults_due and set(seen) == {DROP, LATE, ""}
    finally:
        server.stop(0)
