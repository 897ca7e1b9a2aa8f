"""Redis-stream plumbing shared by producers and consumers of the buffer."""

from __future__ import annotations

import redis

from relayrl.keys import RunKeys
from relayrl.messages import Sample, encode_sample

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


class TrajectoryWriter:
    """What a rollout worker uses to append finished samples to the run's trajectory stream."""

    def __init__(self, r: redis.Redis, keys: RunKeys):
        self.r = r
        self.stream = keys.trajectories

    def append(self, samples: list[Sample]) -> list[bytes]:
        pipe = self.r.pipeline(transaction=True)
        for s in samples:
            pipe.xadd(self.stream, {FIELD: encode_sample(s)})
        return pipe.execute()
