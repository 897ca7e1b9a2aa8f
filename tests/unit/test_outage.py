"""relayrl.runtime.outage: the backoff's bounds, cap and reset; which errors count as an outage
(a busy server's refusal does, a message too large does not, nor does an agent's Submit
retry one); ride_out's retries, stop and give-up; readiness as the health service reports
it."""

import logging
import random
import threading

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from relayrl.plugins.buffer_client import submit_group
from relayrl.runtime.backpressure import StoppedWaiting
from relayrl.runtime.grpc_util import channel, check_health, free_ports
from relayrl.runtime.outage import (
    MAX_WAIT_S,
    JitteredBackoff,
    Outage,
    Readiness,
    is_busy,
    is_outage,
    is_too_large,
    readiness,
    ride_out,
)
from relayrl.runtime.redis_conn import outage_retry
from relayrl.runtime.service import ServiceRunner


def test_the_bound_doubles_to_the_cap_and_a_reset_starts_over():
    b = JitteredBackoff(0.1, 1.0, draw=lambda: 1.0)  # the top of each range
    assert [round(b.next_delay(), 6) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    b.reset()
    assert b.next_delay() == pytest.approx(0.1)


def test_every_wait_is_drawn_within_zero_and_its_bound():
    rng = random.Random(0)
    b = JitteredBackoff(draw=rng.random)
    bound = b.first_s
    waits = []
    for _ in range(200):
        delay = b.next_delay()
        assert 0.0 <= delay <= bound
        waits.append(delay)
        bound = min(bound * 2, MAX_WAIT_S)
    assert max(waits) <= MAX_WAIT_S
    tail = waits[20:]  # at the cap: spread over the range, not bunched at the top
    assert min(tail) < MAX_WAIT_S / 4 and max(tail) > 3 * MAX_WAIT_S / 4


def test_a_dead_port_and_a_passed_deadline_are_outages_a_refusal_is_not():
    dead = free_ports(1)[0]
    stub = health_pb2_grpc.HealthStub(channel(f"127.0.0.1:{dead}"))
    with pytest.raises(grpc.RpcError) as unavailable:
        stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert unavailable.value.code() == grpc.StatusCode.UNAVAILABLE
    assert is_outage(unavailable.value)
    with pytest.raises(grpc.RpcError) as late:  # waiting for the port until the deadline
        stub.Check(health_pb2.HealthCheckRequest(), timeout=0.2, wait_for_ready=True)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert is_outage(late.value)
    assert is_outage(redis.TimeoutError("Timeout reading from socket"))
    assert is_outage(redis.ConnectionError("Connection refused"))
    assert is_outage(redis.BusyLoadingError("loading the dataset"))  # a restarted server
    assert not is_outage(redis.ResponseError("WRONGTYPE"))
    assert not is_outage(ValueError("bad input"))
    # redis-py files a refused password under ConnectionError: waiting will not change it
    assert not is_outage(redis.AuthenticationError("invalid password"))


class Refused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


BUSY = Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!")
TOO_LARGE = Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "Received message larger than max (2097152 vs. 1052672)")
FULL = Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "buffer is full")


def test_a_busy_server_is_waited_out_a_message_too_large_is_not():
    assert is_busy(BUSY) and is_outage(BUSY) and not is_too_large(BUSY)
    assert is_too_large(TOO_LARGE) and not is_busy(TOO_LARGE) and not is_outage(TOO_LARGE)
    assert not is_outage(FULL)  # a handler's own refusal: the caller decides


class Stub:
    def __init__(self, *errors: Refused):
        self.errors, self.calls = list(errors), []

    def Submit(self, request, metadata, timeout):
        self.calls.append(request.request_id)
        if self.errors:
            raise self.errors.pop(0)
        return "accepted"


def test_a_submit_refused_as_busy_is_sent_again_one_too_large_is_not():
    stub = Stub(BUSY, FULL)
    assert submit_group(stub, []) == "accepted"
    assert len(stub.calls) == 3 and len(set(stub.calls)) == 1  # one request id throughout
    stub = Stub(TOO_LARGE)
    with pytest.raises(grpc.RpcError) as info:
        submit_group(stub, [])
    assert info.value is TOO_LARGE and len(stub.calls) == 1


def test_a_refused_password_is_not_tried_again_a_dropped_connection_is():
    calls = []

    def refused():
        calls.append(1)
        raise redis.AuthenticationError("invalid password")

    retry = outage_retry()
    with pytest.raises(redis.AuthenticationError):
        retry.call_with_retry(refused, lambda err: None)
    assert len(calls) == 1

    def dropped_once():
        calls.append(1)
        if len(calls) == 2:
            raise redis.ConnectionError("Connection reset by peer")
        return "ok"

    assert retry.call_with_retry(dropped_once, lambda err: None) == "ok" and len(calls) == 3


def test_readiness_is_lost_with_the_first_wait_and_back_with_the_last():
    board, heard = Readiness(), []
    board.subscribe(heard.append)
    board.enter("redis")
    board.enter("scheduler")
    board.enter("redis")  # two callers wait for one peer
    board.leave("redis")
    board.leave("scheduler")
    assert not board.ready and board.waiting_on() == ["redis"]
    board.leave("redis")
    assert board.ready
    assert heard == [True, False, True]  # told the state at once, then each change


def failing(times: int, err: Exception):
    calls = []

    def call():
        calls.append(readiness.ready)
        if len(calls) <= times:
            raise err
        return "answer"

    return call, calls


def test_ride_out_retries_an_outage_unready_meanwhile_and_logs_it_once(caplog):
    call, calls = failing(4, redis.TimeoutError("Timeout reading from socket"))
    with caplog.at_level(logging.INFO, logger="relayrl.runtime.outage"):
        assert ride_out("redis", call) == "answer"
    assert calls == [True, False, False, False, False]  # unready from the first failure
    assert readiness.ready
    lines = [r.getMessage() for r in caplog.records]
    assert sum("redis unreachable" in line for line in lines) == 1, lines
    assert sum("redis is back after" in line and "(4 tries)" in line for line in lines) == 1


def test_an_error_that_is_no_outage_propagates_at_once():
    call, calls = failing(1, redis.ResponseError("WRONGTYPE"))
    with pytest.raises(redis.ResponseError):
        ride_out("redis", call)
    assert len(calls) == 1 and readiness.ready


def test_a_stop_ends_the_wait_and_give_up_raises_the_last_error():
    stop = threading.Event()
    stop.set()
    call, _ = failing(100, redis.ConnectionError("refused"))
    with pytest.raises(StoppedWaiting):
        ride_out("redis", call, stop)
    assert readiness.ready
    call, calls = failing(10_000, redis.ConnectionError("refused"))
    with pytest.raises(redis.ConnectionError):
        ride_out("redis", call, give_up_s=0.3)
    assert len(calls) > 1 and readiness.ready


def test_an_outage_object_backs_off_until_recovered_then_starts_over():
    outage = Outage("scheduler", JitteredBackoff(0.1, 0.4, draw=lambda: 1.0), Readiness())
    err = redis.ConnectionError("refused")
    assert [outage.failed(err) for _ in range(4)] == pytest.approx([0.1, 0.2, 0.4, 0.4])
    assert outage.down and not outage.board.ready
    outage.recovered()
    assert not outage.down and outage.board.ready
    assert outage.failed(err) == pytest.approx(0.1)
    assert outage.outages == 2
    outage.abandon()


def test_health_says_not_serving_while_the_service_waits_for_a_peer():
    port = free_ports(1)[0]
    address = f"127.0.0.1:{port}"
    runner = ServiceRunner("probe", address, [])
    seen = []

    def loop(stop):
        seen.append(check_health(address))
        readiness.enter("redis")
        seen.append(check_health(address))
        readiness.leave("redis")
        seen.append(check_health(address))

    runner.run(loop, grace_s=0)
    assert seen == [True, False, True]
