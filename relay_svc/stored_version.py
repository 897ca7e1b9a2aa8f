"""One version held by a relay: a flat buffer filled in order, which readers may follow
while it is still arriving (so a relay tree forwards bytes instead of whole versions)."""

from __future__ import annotations

import mmap
import os
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from enum import Enum

import torch

from relayrl_torch.weights.layout import ALIGN, flat_size, shard_offsets, unpack
from relayrl_torch.weights.manifest import Manifest, WeightError, checksum
from relayrl_torch.weights.shm_handoff import HANDOFF_NAME, claim_file, recycle


class HandoffRefused(WeightError):
    """A shared-memory handoff this relay cannot take (no shm_dir, another host, no such
    file): the publisher should send the bytes over gRPC instead."""


class State(Enum):
    PENDING = "pending"
    COMPLETE = "complete"
    FAILED = "failed"


class StoredVersion:
    """`adopt`: the name of a file in `shm_dir` a publisher on this host filled
    (relayrl_torch.weights.shm_handoff); the version is then whole on arrival, still unverified."""

    def __init__(self, manifest: Manifest, shm_dir: str | None = None,
                 adopt: str | None = None):
        self.manifest = manifest
        self.size = flat_size(manifest)
        self.offsets = shard_offsets(manifest)
        self.shm_path: str | None = None
        if adopt is not None:
            self.flat = self._adopt(shm_dir, adopt)
        elif shm_dir is None:
            self.flat = torch.empty(self.size, dtype=torch.uint8)
        else:
            self.flat = self._shm_buffer(shm_dir)
        self._view = memoryview(self.flat.numpy()) if self.size else memoryview(b"")
        self.filled = self.size if adopt is not None else 0
        self.state = State.PENDING
        self.error = ""
        self.released = False  # dropped by its store; readers may still hold the buffer
        self._device_flat: torch.Tensor | None = None  # the nccl plane's copy, made lazily
        self._device_verified = False  # _device_flat checked against the manifest
        self._device_lock = threading.Lock()  # not _cond: readers need not wait for a copy
        self._cond = threading.Condition()

    @property
    def version(self) -> int:
        return self.manifest.version

    def _own_path(self, shm_dir: str) -> str:
        name = f"relayrl-{os.getpid()}-v{self.manifest.version}-{uuid.uuid4().hex[:8]}"
        return os.path.join(shm_dir, name)

    def _shm_buffer(self, shm_dir: str) -> torch.Tensor:
        self.shm_path = self._own_path(shm_dir)
        fd = claim_file(self.shm_path, self.size)
        try:
            mapped = mmap.mmap(fd, max(self.size, 1))
        finally:
            os.close(fd)
        return torch.frombuffer(mapped, dtype=torch.uint8)[:self.size]

    def _adopt(self, shm_dir: str | None, file_name: str) -> torch.Tensor:
        """Take over the publisher's file: renamed to this relay's own name (so release and
        the orphan sweep treat it as any other version) and mapped shared."""
        if shm_dir is None:
            raise HandoffRefused("Publish.shm: this relay keeps versions in process memory "
                                 "(relay.shm_dir is unset); send the bytes over gRPC")
        if not HANDOFF_NAME.fullmatch(file_name):
            raise WeightError(f"Publish.shm.file_name {file_name[:80]!r} is not a handoff "
                              "name (relayrl-<pid>-v<version>-pub<16 hex digits>)")
        source = os.path.join(shm_dir, file_name)
        try:
            fd = os.open(source, os.O_RDWR | os.O_NOFOLLOW)
        except (FileNotFoundError, PermissionError) as err:  # elsewhere, or another user's
            raise HandoffRefused(f"Publish.shm: cannot take {file_name} from relay.shm_dir "
                                 f"{shm_dir} ({err.strerror}); send the bytes over gRPC"
                                 ) from None
        except OSError as err:
            raise WeightError(f"Publish.shm: cannot open {file_name}: {err.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size != max(self.size, 1):
                raise WeightError(f"Publish.shm: {file_name} holds {info.st_size} bytes, not "
                                  f"the {self.size} of version {self.version}'s layout")
            mapped = mmap.mmap(fd, max(self.size, 1))
            self.shm_path = self._own_path(shm_dir)
            os.rename(source, self.shm_path)
        except OSError as err:
            raise WeightError(f"Publish.shm: cannot take {file_name} over: {err}") from None
        finally:
            os.close(fd)
        return torch.frombuffer(mapped, dtype=torch.uint8)[:self.size]

    def on_device(self, device: torch.device, verified: bool = False) -> torch.Tensor:
        """The complete buffer on `device`, copied there on the first call and kept until
        the version is released (transfers in flight hold their own reference). `verified`:
        checked against the manifest where it lies, once (a copy back to the host), for a
        plane whose receiver loads the bytes without checking them."""
        with self._device_lock:
            if self.state is not State.COMPLETE or self.released:
                raise WeightError(f"version {self.version} is {self.state.value}"
                                  f"{' and released' if self.released else ''}")
            if self._device_flat is None:
                # a copy even on the CPU, where gloo stands in for NCCL: the stand-in then
                # serves a buffer of its own, as a GPU copy would be
                self._device_flat = torch.empty(self.size, dtype=torch.uint8, device=device)
                self._device_flat.copy_(self.flat)
                self._device_verified = False
            if verified and not self._device_verified:
                unpack(self.manifest, self._device_flat)  # WeightError names a bad shard
                self._device_verified = True
            return self._device_flat

    def release(self, recycle_file: bool = False) -> None:
        """Drop the shared-memory name and the device copy; readers that mapped the one or
        hold the other keep theirs. `recycle_file`: keep the file as a spare for a later
        version (relayrl_torch.weights.shm_handoff.recycle), a reader still copying from it then
        getting bytes its checksums refuse."""
        self.released = True
        with self._device_lock:
            self._device_flat = None
        if self.shm_path is None:
            return
        if recycle_file:
            recycle(self.shm_path)
            return
        try:
            os.unlink(self.shm_path)
        except FileNotFoundError:
            pass

    # -- writing -------------------------------------------------------------------------

    def write_shard(self, shard: str, offset: int, data: bytes | memoryview) -> None:
        """Bytes of one shard; shards must arrive in manifest order, each in order."""
        if shard not in self.offsets:
            raise WeightError(f"version {self.version} has no shard {shard!r}")
        info = self.manifest.shard(shard)
        if offset < 0 or offset + len(data) > info.nbytes:
            raise WeightError(f"chunk for shard {shard!r} at offset {offset} does not fit "
                              f"its {info.nbytes} bytes")
        flat_off = self.offsets[shard] + offset
        if offset == 0 and self.filled <= flat_off < self.filled + ALIGN:
            self.filled = flat_off  # skip the padding before a shard
        self.write_flat(flat_off, data)

    def write_flat(self, offset: int, data: bytes | memoryview) -> None:
        if self.state is not State.PENDING:
            raise WeightError(f"version {self.version} is {self.state.value}, not writable")
        if offset != self.filled:
            raise WeightError(f"version {self.version}: bytes at offset {offset} arrived out "
                              f"of order (expected {self.filled})")
        end = offset + len(data)
        if end > self.size:
            raise WeightError(f"version {self.version}: {end} bytes exceed its layout size "
                              f"{self.size}")
        self._view[offset:end] = data
        with self._cond:
            self.filled = end
            self._cond.notify_all()

    def commit(self) -> None:
        """Verify every shard in place; the version becomes readable as complete, or fails."""
        try:
            if self.filled != self.size:
                raise WeightError(f"version {self.version}: received {self.filled} of "
                                  f"{self.size} bytes")
            for s in self.manifest.shards:
                off = self.offsets[s.name]
                if checksum(self._view[off:off + s.nbytes]) != s.checksum:
                    raise WeightError(f"shard {s.name!r}: checksum mismatch")
        except WeightError as err:
            self.fail(str(err))
            raise
        with self._cond:
            if self.state is not State.PENDING:  # failed meanwhile: replaced by a retry
                raise WeightError(f"version {self.version} is {self.state.value}: {self.error}")
            self.state = State.COMPLETE
            self._cond.notify_all()

    def fail(self, error: str) -> None:
        with self._cond:
            if self.state is State.PENDING:
                self.state, self.error = State.FAILED, error
            self._cond.notify_all()

    # -- reading -------------------------------------------------------------------------

    def read(self, start: int, end: int, chunk_bytes: int, stall_timeout_s: float
             ) -> Iterator[memoryview]:
        """Consecutive slices of [start, end), each yielded as soon as it has arrived."""
        end = end or self.size
        if not 0 <= start <= end <= self.size:
            raise WeightError(f"range [{start}, {end}) is outside version {self.version}'s "
                              f"{self.size} bytes")
        pos = start
        while pos < end:
            with self._cond:
                deadline = time.monotonic() + stall_timeout_s
                while self.filled <= pos and self.state is State.PENDING:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise WeightError(f"version {self.version} stalled at byte "
                                          f"{self.filled} for {stall_timeout_s:.0f}s")
                    self._cond.wait(left)
                if self.state is State.FAILED:
                    raise WeightError(f"version {self.version} failed: {self.error}")
                avail = min(self.filled, end)
            while pos < avail:
                stop = min(pos + chunk_bytes, avail)
                yield self._view[pos:stop]
                pos = stop
        if self.state is not State.COMPLETE:
            self.wait_complete(stall_timeout_s)  # never end a stream on unverified bytes

    def wait_complete(self, timeout_s: float) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.state is not State.PENDING, timeout_s):
                raise WeightError(f"version {self.version} not complete after {timeout_s:.0f}s")
            if self.state is State.FAILED:
                raise WeightError(f"version {self.version} failed: {self.error}")
