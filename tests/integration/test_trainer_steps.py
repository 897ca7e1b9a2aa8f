"""relayrl.runtime.progress on a real (embedded) Redis: a worker waiting for room under the
in-flight
cap wakes at the trainer's step, not at the end of its wait, and a Redis that is away costs
it the wait, never an exception."""

import threading
import time

import pytest

from relayrl.contracts.keys import RunKeys
from relayrl.runtime.progress import KEEP, StepWaiter, announce_step
from relayrl.runtime.redis_conn import EmbeddedRedis, connect

KEYS = RunKeys("steps")


@pytest.fixture
def server(tmp_path):
    server = EmbeddedRedis(tmp_path)
    yield server
    server.shutdown()


def step(r, n: int) -> None:
    pipe = r.pipeline(transaction=True)
    announce_step(pipe, KEYS, n)
    pipe.execute()


def test_a_step_wakes_a_waiting_worker_before_its_wait_ends(server):
    r, stop = connect(server.url), threading.Event()
    waiter = StepWaiter(r, KEYS)
    assert not waiter.wait(0.01, stop)  # no step yet
    threading.Timer(0.2, step, args=(connect(server.url), 1)).start()
    t0 = time.monotonic()
    assert waiter.wait(30.0, stop)
    assert time.monotonic() - t0 < 29.0  # woken by the step, not by the 30 s wait
    assert not waiter.wait(0.01, stop)  # that step is seen: nothing new


def test_steps_taken_before_the_wait_answer_at_once_and_the_stream_stays_short(server):
    r, stop = connect(server.url), threading.Event()
    for n in range(1, 1000):
        step(r, n)
    waiter = StepWaiter(r, KEYS)
    assert waiter.wait(30.0, stop)  # returns at once: steps it has not seen
    assert not waiter.wait(0.01, stop)
    assert r.xlen(KEYS.trainer_steps) < 1000 - KEEP  # trimmed (approximately) to KEEP


def test_with_redis_away_the_worker_waits_out_its_wait(server):
    r, stop = connect(server.url), threading.Event()
    waiter = StepWaiter(r, KEYS)
    server.shutdown()
    t0 = time.monotonic()
    assert not waiter.wait(0.3, stop)
    assert time.monotonic() - t0 >= 0.25
