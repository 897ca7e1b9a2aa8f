"""The prompt ledger (relayrl.contracts.ledger) on a real embedded Redis: scheduler ids as bits,
external ids in a set beside them, written atomically with other commands."""

import pytest

from buffer_svc.emit import BatchAppender
from relayrl.contracts import ledger
from relayrl.contracts.keys import EXTERNAL_PROMPT_BASE, RunKeys
from relayrl.runtime.redis_conn import EmbeddedRedis, connect

pytestmark = pytest.mark.integration

EXT = EXTERNAL_PROMPT_BASE
KEYS = RunKeys("ledger")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = EmbeddedRedis(tmp_path_factory.mktemp("ledger"))
    yield server
    server.shutdown()


@pytest.fixture
def r(server):
    client = connect(server.url)
    client.flushall()
    return client


def test_scheduler_and_external_ids_round_trip(r):
    ids = {0, 1, 7, 8, 1000, EXT, EXT + 12345}
    ledger.add(r, KEYS, "batched", sorted(ids))
    ledger.add(r, KEYS, "batched", [7, EXT])  # again: nothing changes
    assert ledger.members(r, KEYS, "batched") == ids
    assert ledger.count(r, KEYS, "batched") == len(ids)
    assert all(ledger.contains(r, KEYS, "batched", p) for p in ids)
    assert not any(ledger.contains(r, KEYS, "batched", p) for p in (2, 9, 999, EXT + 1))
    assert ledger.members(r, KEYS, "consumed") == set() and not ledger.count(r, KEYS, "failed")


def test_decoding_agrees_with_redis_bit_order(r):
    ledger.add(r, KEYS, "leased", [3, 9, 70])
    bitmap = KEYS.ledger("leased")
    assert [r.getbit(bitmap, i) for i in (2, 3, 9, 70)] == [0, 1, 1, 1]
    assert r.strlen(bitmap) == 9  # bit 70 lies in the ninth byte
    assert ledger.members(r, KEYS, "leased") == {3, 9, 70}


def test_writes_in_a_transaction_land_together_with_the_rest(r):
    pipe = r.pipeline(transaction=True)
    pipe.xadd("stream", {"data": b"x"})
    ledger.add(pipe, KEYS, "consumed", [4, 5, EXT])
    ledger.add(pipe, KEYS, "dropped", [6])
    assert ledger.count(r, KEYS, "consumed") == 0  # queued, not yet run
    pipe.execute()
    assert r.xlen("stream") == 1
    assert ledger.members(r, KEYS, "consumed") == {4, 5, EXT}
    assert ledger.members(r, KEYS, "dropped") == {6}


def test_the_batch_script_checks_and_adds_both_kinds_of_id(r):
    appender = BatchAppender(r, KEYS)
    assert appender.append(b"one", [0, 1, EXT], [])
    assert not appender.append(b"one", [0, 1, EXT], [])  # a repeat appends nothing
    assert appender.append(b"two", [0, EXT + 1], [])  # one fresh id is a fresh batch
    assert appender.append(b"three", [2], [])
    assert r.xlen(KEYS.batches) == 3
    assert ledger.members(r, KEYS, "batched") == {0, 1, 2, EXT, EXT + 1}


def test_many_prompts_take_about_a_bit_each(r):
    for start in range(0, 100_000, 1000):  # as a run adds them, a few at a time
        ledger.add(r, KEYS, "leased", range(start, start + 1000))
    assert ledger.count(r, KEYS, "leased") == 100_000
    bitmap = KEYS.ledger("leased")
    assert r.strlen(bitmap) == 12_500
    # a string Redis grows keeps room for up to as much again (its preallocation)
    assert r.memory_usage(bitmap) < 2 * 12_500 + 1000
    assert ledger.members(r, KEYS, "leased") == set(range(100_000))


def test_a_set_where_the_bitmap_belongs_is_named(r):
    r.sadd(KEYS.ledger("batched"), 0, 1)  # as a run from before the bitmap ledger
    for read in (ledger.members, ledger.count):
        with pytest.raises(ledger.LedgerFormatError, match="ledger:batched.*not a bitmap"):
            read(r, KEYS, "batched")
    with pytest.raises(ledger.LedgerFormatError, match="not a bitmap"):
        ledger.add(r, KEYS, "batched", [2])


@pytest.mark.parametrize("bad", [-1, 1 << 32, EXT - 1])
def test_ids_that_are_neither_kind_are_refused(r, bad):
    with pytest.raises(ValueError, match=str(bad)):
        ledger.add(r, KEYS, "leased", [bad])


def test_an_unknown_ledger_is_refused(r):
    with pytest.raises(ValueError, match="no ledger named 'trained'"):
        ledger.members(r, KEYS, "trained")
