"""The run's prompt ledger in Redis: which prompt ids passed each stage (keys.LEDGER_SETS).

A scheduler prompt id is a small integer counted up from 0, so each ledger holds those as
one bit per prompt in a Redis bitmap (offset = prompt id): a few KB for a long run, where
a set of ids grew by ~60 bytes per prompt and was most of Redis's growth in a soak. Ids of
externally submitted groups (keys.is_external, from 2**40) lie past Redis's bit offsets
(< 2**32); they are rare and kept in a small set beside the bitmap.

`add` takes a client or a pipeline: in a pipeline (MULTI included) its writes are queued
with the caller's other commands and land atomically with them; the reads take a client.
A Lua script that keeps a ledger itself (buffer_svc.emit) uses `split` and `ledger_keys`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from redis.exceptions import ResponseError

from relayrl.contracts.keys import LEDGER_SETS, RunKeys, is_external

BITMAP_OFFSET_LIMIT = 1 << 32  # Redis refuses bit offsets from here up
# ids per BITFIELD command: one command per chunk keeps each a bounded size on the wire
_CHUNK = 4096


class LedgerFormatError(RuntimeError):
    """A ledger key holds something other than the bitmap this code writes."""


@dataclass(frozen=True)
class LedgerKeys:
    bitmap: str  # scheduler prompt ids, one bit each
    external: str  # set of external prompt ids


def ledger_keys(keys: RunKeys, name: str) -> LedgerKeys:
    if name not in LEDGER_SETS:
        raise ValueError(f"no ledger named {name!r}; ledgers are {', '.join(LEDGER_SETS)}")
    return LedgerKeys(keys.ledger(name), keys.ledger_external(name))


def split(prompt_ids: Iterable[int]) -> tuple[list[int], list[int]]:
    """(scheduler ids, external ids), each in the order given."""
    internal, external = [], []
    for pid in prompt_ids:
        pid = int(pid)
        if is_external(pid):
            external.append(pid)
        elif 0 <= pid < BITMAP_OFFSET_LIMIT:
            internal.append(pid)
        else:
            raise ValueError(f"prompt id {pid} is neither a scheduler id (0 to 2**32 - 1) "
                             "nor an external one (from 2**40)")
    return internal, external


def add(r, keys: RunKeys, name: str, prompt_ids: Iterable[int]) -> None:
    """Record prompt ids in ledger `name`; on a pipeline, queued with its other commands."""
    k = ledger_keys(keys, name)
    internal, external = split(prompt_ids)
    for start in range(0, len(internal), _CHUNK):
        ops = []
        for pid in internal[start:start + _CHUNK]:
            ops += ("SET", "u1", pid, 1)
        _checked(r.execute_command, k.bitmap, "BITFIELD", k.bitmap, *ops)
    if external:
        r.sadd(k.external, *external)


def contains(r, keys: RunKeys, name: str, prompt_id: int) -> bool:
    k = ledger_keys(keys, name)
    internal, external = split([prompt_id])
    if external:
        return bool(r.sismember(k.external, prompt_id))
    return bool(_checked(r.getbit, k.bitmap, k.bitmap, internal[0]))


def members(r, keys: RunKeys, name: str) -> set[int]:
    """Every prompt id in ledger `name`."""
    k = ledger_keys(keys, name)
    bitmap = _checked(r.get, k.bitmap, k.bitmap) or b""
    return set(_set_bits(bitmap)) | {int(x) for x in r.smembers(k.external)}


def count(r, keys: RunKeys, name: str) -> int:
    k = ledger_keys(keys, name)
    return int(_checked(r.bitcount, k.bitmap, k.bitmap)) + int(r.scard(k.external))


def all_members(r, keys: RunKeys) -> dict[str, set[int]]:
    """Every ledger of the run, by name."""
    return {name: members(r, keys, name) for name in LEDGER_SETS}


def _set_bits(bitmap: bytes) -> list[int]:
    # unpackbits' default (big) bit order is Redis's: offset 0 is the first byte's top bit
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8))
    return np.flatnonzero(bits).tolist()


def _checked(command, key: str, *args):
    """Run a command on a ledger bitmap, naming the key when it is not one (WRONGTYPE: a
    run written before the ledger was a bitmap, which this code does not read)."""
    try:
        return command(*args)
    except ResponseError as err:
        if str(err).startswith("WRONGTYPE"):
            raise LedgerFormatError(
                f"ledger key {key} is not a bitmap (a run from before the bitmap ledger, "
                "whose ledgers were sets of ids, cannot be read by this version)") from err
        raise
