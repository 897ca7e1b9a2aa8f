"""A version as the changes since an older one with the same layout: what the relay sends a
worker that already holds the older version (Relay.PullDelta).

Between versions a few optimizer steps apart most low-precision elements do not change (a
bfloat16 weight moves only when its float32 master crosses half a bfloat16 step), so each
shard is sent as whichever of these is smallest:

    RAW     the shard's bytes, whole
    BITMAP  one bit per element, set where it changed (numpy.packbits order), then the
            changed elements' new bytes in position order
    GAPS    a byte per changed element, the number r < 255 of unchanged ones before it
            (since the previous change), with a byte 255 for each further 255 unchanged
            ones; then the changed elements' new bytes in position order

An unchanged shard is GAPS with nothing changed: no bytes. Elements are compared as
integers of the dtype's width, so any dtype of 1, 2, 4 or 8 bytes is coded by element and
any other is sent RAW. The payload is the shards' codes back to back, in manifest order.

A worker (Builder) refuses (BadDelta) a delta whose header does not fit the manifest before
it writes anything, and a shard whose code does not fit before writing that shard; it
checks every shard against the manifest's checksum after applying, as for a whole version.
It builds each shard as soon as its code has arrived, while the rest is still received.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from relayrl.contracts.proto.v1 import relay_pb2
from relayrl_torch.weights.layout import shard_offsets
from relayrl_torch.weights.manifest import (
    Manifest,
    ShardInfo,
    WeightError,
    checksum,
    torch_dtype,
)

Encoding = relay_pb2.DeltaEncoding
RAW, BITMAP, GAPS = Encoding.DELTA_ENCODING_RAW, Encoding.DELTA_ENCODING_BITMAP, \
    Encoding.DELTA_ENCODING_GAPS
_ELEMENT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_VALUES_ALIGN = 8
SKIP = 255  # a gap byte that moves on 255 unchanged elements and marks no change


class BadDelta(WeightError):
    """A delta that does not fit the version it claims to build: refused before applying."""


@dataclass(frozen=True)
class Delta:
    """`base`'s bytes to `target`'s: one DeltaShard per shard of the target, in manifest
    order, and their codes back to back in `payload`."""
    base: int
    target: int
    shards: tuple[relay_pb2.DeltaShard, ...]
    payload: bytes

    @property
    def nbytes(self) -> int:
        return len(self.payload)

    def header(self) -> relay_pb2.DeltaHeader:
        return relay_pb2.DeltaHeader(version=self.target, base_version=self.base,
                                     shards=self.shards, payload_bytes=self.nbytes)


def same_layout(a: Manifest, b: Manifest) -> bool:
    """Whether `b`'s shards have `a`'s names, dtypes and shapes, in order (so the offsets of
    relayrl_torch.weights.layout agree)."""
    return [(s.name, s.dtype, s.shape) for s in a.shards] == [
        (s.name, s.dtype, s.shape) for s in b.shards]


# -- gaps: runs of unchanged elements, a byte each -------------------------------------------

def encode_gaps(positions: np.ndarray) -> bytes:
    """The changed `positions` (increasing) as gap bytes: r < 255 says r unchanged elements
    then a changed one; 255 says 255 unchanged ones and no change yet."""
    gaps = np.diff(positions, prepend=-1) - 1
    skips, rest = np.divmod(gaps, SKIP)
    out = np.full(int(skips.sum()) + len(gaps), SKIP, dtype=np.uint8)
    out[np.cumsum(skips + 1) - 1] = rest
    return out.tobytes()


def decode_gaps(data: np.ndarray, count: int, n: int, what: str,
                scratch: np.ndarray | None = None) -> np.ndarray:
    """The `count` changed positions that gap bytes `data` code, each below `n`, or
    BadDelta naming `what`. `scratch`: int64 room for len(data) positions, reused (fresh
    memory costs a page fault per 4 KiB)."""
    change = None
    if count != len(data):  # skip bytes among them
        change = data != SKIP
        if int(np.count_nonzero(change)) != count or not change[-1]:
            raise BadDelta(f"{what}: {len(data)} gap bytes do not code exactly {count} changes")
    elif count and data.max() == SKIP:  # as many bytes as changes: none may be a skip
        raise BadDelta(f"{what}: {len(data)} gap bytes do not code exactly {count} changes")
    # the k-th change's position: the sum over the bytes up to it of r + 1 for a change and
    # 255 for a skip, less one
    positions = scratch[:len(data)] if scratch is not None and len(scratch) >= len(data) \
        else np.empty(len(data), dtype=np.int64)
    # widened into `positions` first: widening inside cumsum is several times slower
    np.add(data, 1 if change is None else change, out=positions, dtype=np.int64)
    if len(positions):
        positions[0] -= 1
    np.cumsum(positions, out=positions)
    if change is not None:
        positions = positions[change]
    if count and positions[-1] >= n:
        raise BadDelta(f"{what}: a changed position is past the shard's {n} elements")
    return positions


# -- the relay's side: encode -----------------------------------------------------------------

def _element_size(info: ShardInfo) -> int | None:
    size = torch_dtype(info.dtype).itemsize
    return size if size in _ELEMENT else None


def encode_shard(info: ShardInfo, base: np.ndarray, target: np.ndarray
                 ) -> tuple[relay_pb2.DeltaShard, list[bytes | memoryview]]:
    """The smallest code of `target`'s bytes (uint8) over `base`'s for one shard."""
    size = _element_size(info)
    raw = (relay_pb2.DeltaShard(shard=info.name, encoding=RAW, changed=0, nbytes=info.nbytes),
           [memoryview(target)])
    if size is None or not info.nbytes:
        return raw
    old, new = base.view(_ELEMENT[size]), target.view(_ELEMENT[size])
    changed_mask = old != new
    changed = int(np.count_nonzero(changed_mask))
    n = info.nbytes // size
    bitmap_bytes = (n + 7) // 8 + changed * size
    if changed * (size + 1) < min(info.nbytes, bitmap_bytes):
        positions = np.flatnonzero(changed_mask)
        gaps = encode_gaps(positions)
        if len(gaps) + changed * size < min(info.nbytes, bitmap_bytes):
            values = new[positions].tobytes()
            return (relay_pb2.DeltaShard(shard=info.name, encoding=GAPS, changed=changed,
                                         nbytes=len(gaps) + len(values)), [gaps, values])
    if bitmap_bytes < info.nbytes:
        return (relay_pb2.DeltaShard(shard=info.name, encoding=BITMAP, changed=changed,
                                     nbytes=bitmap_bytes),
                [np.packbits(changed_mask).tobytes(), new[changed_mask].tobytes()])
    return raw


def encode(base: Manifest, base_flat: torch.Tensor, target: Manifest,
           target_flat: torch.Tensor) -> Delta | None:
    """`target` as the changes since `base` (both flat buffers, verified), or None where it
    cannot be one (another layout) or would not be smaller than the whole version."""
    if not same_layout(base, target):
        return None
    offsets = shard_offsets(target)
    old, new = base_flat.numpy(), target_flat.numpy()
    shards, parts, total, whole = [], [], 0, target.total_bytes
    for info in target.shards:
        start = offsets[info.name]
        header, codes = encode_shard(info, old[start:start + info.nbytes],
                                     new[start:start + info.nbytes])
        shards.append(header)
        parts += codes
        total += header.nbytes
        if total >= whole:
            return None
    return Delta(base.version, target.version, tuple(shards), b"".join(parts))


# -- the worker's side: check, then apply -----------------------------------------------------

@dataclass(frozen=True)
class _Code:
    shard: relay_pb2.DeltaShard
    info: ShardInfo
    start: int  # where its code starts in the payload
    end: int
    at: int  # where it starts in the Builder's copy of the payload
    offset: int  # the shard's offset in the flat buffer


@dataclass(frozen=True)
class _Patch:
    start: int  # the shard's offset in the flat buffer
    info: ShardInfo
    encoding: int
    positions: np.ndarray | None  # the changed elements (GAPS, BITMAP)
    values: np.ndarray  # their new bytes (uint8), or the whole shard's (RAW)


def _check_shard(d: relay_pb2.DeltaShard, info: ShardInfo, code: np.ndarray, start: int,
                 scratch: np.ndarray | None = None) -> _Patch:
    what = f"delta of shard {info.name!r}"
    if d.encoding == RAW:
        if d.nbytes != info.nbytes:
            raise BadDelta(f"{what}: RAW code of {d.nbytes} bytes, the shard has {info.nbytes}")
        return _Patch(start, info, RAW, None, code)
    size = _element_size(info)
    if size is None or d.encoding not in (BITMAP, GAPS):
        raise BadDelta(f"{what}: encoding {d.encoding} does not apply to dtype {info.dtype}")
    n = info.nbytes // size
    if not 0 <= d.changed <= n:
        raise BadDelta(f"{what}: changed {d.changed} is outside 0..{n} elements")
    values_bytes = d.changed * size
    if d.encoding == BITMAP:
        if d.nbytes != (n + 7) // 8 + values_bytes:
            raise BadDelta(f"{what}: BITMAP code of {d.nbytes} bytes, {n} elements with "
                           f"{d.changed} changed need {(n + 7) // 8 + values_bytes}")
        bits = code[:(n + 7) // 8]
        if n % 8 and bits[-1] & ((1 << (8 - n % 8)) - 1):
            raise BadDelta(f"{what}: bits set past the shard's {n} elements")
        # as bool: numpy's nonzero of a bool array is several times faster than of uint8
        positions = np.flatnonzero(np.unpackbits(bits, count=n).view(np.bool_))
        if len(positions) != d.changed:
            raise BadDelta(f"{what}: the bitmap marks {len(positions)} elements, the header "
                           f"{d.changed}")
    else:
        if d.nbytes < values_bytes:
            raise BadDelta(f"{what}: GAPS code of {d.nbytes} bytes cannot hold {d.changed} "
                           f"values of {size} bytes")
        positions = decode_gaps(code[:d.nbytes - values_bytes], d.changed, n, what, scratch)
    return _Patch(start, info, d.encoding, positions, code[d.nbytes - values_bytes:])


def _check_header(header: relay_pb2.DeltaHeader, base: Manifest, target: Manifest) -> None:
    if (header.version, header.base_version) != (target.version, base.version):
        raise BadDelta(f"delta header: {header.base_version} -> {header.version}, asked "
                       f"{base.version} -> {target.version}")
    if not same_layout(base, target):
        raise BadDelta(f"delta: versions {base.version} and {target.version} differ in layout")
    if [d.shard for d in header.shards] != [s.name for s in target.shards]:
        raise BadDelta("delta header: its shards are not the manifest's, in order")
    if any(d.nbytes < 0 for d in header.shards) or sum(
            d.nbytes for d in header.shards) != header.payload_bytes:
        raise BadDelta(f"delta header: shard codes do not add up to its payload of "
                       f"{header.payload_bytes} bytes")


def _lead(d: relay_pb2.DeltaShard, size: int) -> int:
    """The bytes of a shard's code before its values (gap bytes, or the bitmap), within
    0..nbytes whatever the header claims: checked with the rest of the code later."""
    return min(d.nbytes, max(0, d.nbytes - d.changed * size))


class Builder:
    """Builds `target` in `flat` (uint8 on the CPU, holding `base`'s bytes) from a delta as
    its payload arrives (`feed`, then `finish`). Each shard is checked, written and verified
    against the manifest's checksum as soon as its code is whole, on torch's intra-op count
    of threads (numpy and xxhash release the GIL), while later shards are still on the
    wire.

    The payload is kept with each shard's new values starting on an 8-byte boundary, so they
    are read as aligned elements; each thread decodes positions into an int64 scratch of its
    own. The writes are numpy's: torch's index_copy_ is faster on one thread, but its intra-op
    threads compete with the receive and the other shards, and the pull took longer.

    A header that does not fit the manifests is refused (BadDelta) before anything is
    written; a shard's code that does not fit is refused unwritten, from `finish`, which names
    the first such shard in order. Shards before it may have been written: `flat` then holds
    neither version, and the caller pulls the target whole over it."""

    def __init__(self, header: relay_pb2.DeltaHeader, base: Manifest, target: Manifest,
                 flat: torch.Tensor):
        _check_header(header, base, target)
        self.received = 0
        self._size = header.payload_bytes
        self._flat = flat.numpy()
        # each shard's code: where it sits in the payload and in the kept copy (`at`), its
        # values aligned
        offsets, end, at, self._codes = shard_offsets(target), 0, 0, []
        for d, info in zip(header.shards, target.shards, strict=True):
            size = _element_size(info) or 1
            lead = _lead(d, size) if d.encoding != RAW else 0
            at += -(at + lead) % _VALUES_ALIGN
            self._codes.append(_Code(d, info, end, end + d.nbytes, at, offsets[info.name]))
            end += d.nbytes
            at += d.nbytes
        self.payload = np.empty(at, dtype=np.uint8)
        assert self.payload.ctypes.data % _VALUES_ALIGN == 0  # numpy aligns to 16 at least
        self._copied = 0  # the codes whose bytes have all arrived
        self._started: list = []
        self._scratch = threading.local()
        self._pool = ThreadPoolExecutor(max(1, torch.get_num_threads()),
                                        thread_name_prefix="delta")

    def feed(self, piece: memoryview | bytes) -> None:
        """The payload's next bytes; BadDelta past the header's payload_bytes."""
        start, end = self.received, self.received + len(piece)
        if end > self._size:
            raise BadDelta(f"delta: more than the header's {self._size} payload bytes")
        data = np.frombuffer(piece, dtype=np.uint8)
        k = self._copied
        while k < len(self._codes) and self._codes[k].start <= end:
            code = self._codes[k]
            lo, hi = max(code.start, start), min(code.end, end)
            self.payload[code.at + lo - code.start:code.at + hi - code.start] = \
                data[lo - start:hi - start]
            if code.end > end:
                break
            k += 1
            self._started.append(self._pool.submit(self._build, code))
        self._copied = k
        self.received = end

    def finish(self) -> None:
        """Wait for every shard; BadDelta for a payload short of the header's or the first
        shard, in order, whose code does not fit or whose bytes do not verify."""
        try:
            if self.received != self._size:
                raise BadDelta(f"delta: received {self.received} of the header's "
                               f"{self._size} payload bytes")
            self.feed(b"")  # codes of no bytes at the end
            for started in self._started:
                started.result()
        finally:
            self.close()

    def close(self) -> None:
        """Stop: shards not started are not written (a stream abandoned midway)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _positions_scratch(self, n: int) -> np.ndarray:
        held = getattr(self._scratch, "positions", None)
        if held is None or len(held) < n:
            held = self._scratch.positions = np.empty(n, dtype=np.int64)
        return held

    def _build(self, code: _Code) -> None:
        d, info = code.shard, code.info
        scratch = None
        if d.encoding == GAPS:  # a gap byte per position, the values after them
            scratch = self._positions_scratch(_lead(d, _element_size(info) or 1))
        patch = _check_shard(d, info, self.payload[code.at:code.at + d.nbytes], code.offset,
                             scratch)
        shard = self._flat[code.offset:code.offset + info.nbytes]
        if patch.encoding == RAW:
            shard[:] = patch.values
        elif len(patch.positions):
            element = _ELEMENT[torch_dtype(info.dtype).itemsize]
            shard.view(element)[patch.positions] = patch.values.view(element)
        if checksum(memoryview(shard)) != info.checksum:
            raise BadDelta(f"delta of shard {info.name!r}: after applying, the checksum "
                           "does not match the manifest's")
