"""Redis-stream plumbing shared by producers and consumers of the buffer.

The trajectory stream holds one entry per group (relayrl.contracts.messages.Group, its samples in
one encoded value); every group is buffer.group_size samples (Submit refuses others, and
every worker samples that many per prompt), so the stream holds XLEN x group_size samples,
which is what buffer.max_pending_samples bounds.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from relayrl.contracts.keys import RunKeys
from relayrl.contracts.messages import Group, encode_group
from relayrl.runtime.backpressure import Backoff, PressureCounters
from relayrl.runtime.outage import redis_write

log = logging.getLogger(__name__)
FIELD = b"data"


def ensure_group(r: redis.Redis, stream: str, group: str) -> None:
    try:
        r.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as err:
        if "BUSYGROUP" not in str(err):
            raise


def read_group(r: redis.Redis, stream: str, group: str, consumer: str, *, count: int,
               block_ms: int, pending_after: bytes | None = None
               ) -> list[tuple[bytes, bytes | None]]:
    """[(entry id, payload)] of new entries, or, with `pending_after`, of this consumer's
    unacknowledged entries after that id (re-read after a restart; start from b"0").
    A payload is None when the entry was deleted."""
    start = ">" if pending_after is None else pending_after
    resp = r.xreadgroup(group, consumer, {stream: start}, count=count,
                        block=None if pending_after is not None else block_ms)
    out = []
    for _stream, entries in resp or []:
        for entry_id, fields in entries:
            out.append((entry_id, (fields or {}).get(FIELD)))
    return out


def pending_samples(r: redis.Redis, keys: RunKeys, group_size: int) -> int:
    """Samples on the trajectory stream not yet batched (see the module docstring)."""
    return r.xlen(keys.trajectories) * group_size


# Append a group only if the stream then holds at most the bound in samples: checked and
# written in one step, so producers racing for the last room cannot overshoot it together.
# ARGV: the bound, the group's size, its payload. Redis refuses a script for its memory limit
# at the first write, so a refused group writes nothing.
ADMIT_SCRIPT = """
local size = tonumber(ARGV[2])
local depth = redis.call('XLEN', KEYS[1]) * size
if depth + size > tonumber(ARGV[1]) then return {0, depth} end
return {1, redis.call('XADD', KEYS[1], '*', 'data', ARGV[3])}
"""


class BufferFull(Exception):
    def __init__(self, depth: int, bound: int):
        super().__init__(f"the buffer holds {depth} samples not yet batched, at its bound "
                         f"(buffer.max_pending_samples = {bound}); retry later")
        self.depth, self.bound = depth, bound


class TrajectoryWriter:
    """What rollout workers use to append finished groups to the run's trajectory stream,
    never past `max_pending` samples waiting there (Buffer.Submit appends its own way)."""

    def __init__(self, r: redis.Redis, keys: RunKeys, max_pending: int):
        assert FIELD == b"data"  # ADMIT_SCRIPT writes the field by name
        self.r = r
        self.stream = keys.trajectories
        self.max_pending = max_pending
        self.counters = PressureCounters()
        self.waiting_for_room = False
        self._admit = r.register_script(ADMIT_SCRIPT)

    def try_append(self, group: Group) -> bytes:
        """One attempt: the entry id, BufferFull when there is no room now, or Redis's
        refusal (is_oom) when it is at its memory limit."""
        size = len(group.samples)
        if size > self.max_pending:
            raise ValueError(f"{size} samples can never fit under "
                             f"buffer.max_pending_samples ({self.max_pending})")
        reply = self._admit(keys=[self.stream], args=[self.max_pending, size, encode_group(group)])
        if reply[0] == 0:
            raise BufferFull(int(reply[1]), self.max_pending)
        return reply[1]

    def append(self, group: Group, stop: threading.Event | None = None) -> bytes:
        """Append, waiting (with backoff) while the buffer is full, Redis refuses writes or
        is away (relayrl.runtime.outage); StoppedWaiting if `stop` is set first. An append repeated
        after a timeout may land twice: the buffer keeps one group per prompt and discards
        the copy (buffer_svc.assembler)."""
        backoff, full_since = Backoff(), None
        while True:
            try:
                entry_id = redis_write(lambda: self.try_append(group), self.counters,
                                       "a producer's append", stop)
            except BufferFull as full:
                if full_since is None:
                    full_since = time.monotonic()
                    log.info("buffer full (%s); waiting for the trainer", full)
                self.waiting_for_room = True
                self.counters.full_waits += 1
                t0 = time.monotonic()
                try:
                    backoff.wait(stop)
                finally:
                    self.counters.full_wait_s += time.monotonic() - t0
                    self.waiting_for_room = False
                continue
            if full_since is not None:
                log.info("buffer has room again after %.1f s", time.monotonic() - full_since)
            return entry_id
