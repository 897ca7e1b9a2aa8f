"""Publishing a version through shared memory, for a trainer on its relay's host.

Over gRPC a version is copied into messages, through the loopback socket and out of them
again; for SmolLM2 (538 MB) that took 1.5-2.7 s a step on two busy cores. Here the publisher
writes the version's flat buffer (relayrl_torch.weights.layout) straight into a new file in the
relay's `shm_dir` and sends only the manifest and the file's name; the relay renames the
file to its own, checks every shard's checksum in place, and serves it like a version it
received (its shm plane maps that same file). The publisher never touches the file again:
each version gets a new one.

Names follow the relay's own (relayrl-<pid>-v<version>-...), so a file whose publisher died
before the handoff is swept by the next relay to start on that directory.

Files are recycled: a version the relay lets go (past relay.keep_versions) is renamed to a
spare, and the next version's file, the publisher's or the relay's own, is a spare renamed
again when one is waiting. Writing a version into fresh tmpfs pages cost 0.2-1.6 s for
SmolLM2 (538 MB) on this VM during a run, into a spare's 0.12 s. A reader still copying the
old version out of a recycled file gets torn bytes, which its checksums refuse (a pull is
verified), and it pulls again.

A trainer on the CPU writes each version straight from its live weights
(`StagedVersion.write`): no host snapshot of the weights is kept beside the file. It keeps the
file mapped and holds a shared lock on it (flock) while it reads the version back (to re-score
older tokens under it); a relay letting go of a file so held removes it instead of recycling
it, so the bytes under the mapping never change.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import mmap
import os
import re
import stat
import threading
import uuid

import torch

from relayrl_torch.weights.layout import flat_size, shard_offsets
from relayrl_torch.weights.manifest import Manifest, ShardInfo, checksum, tensor_bytes, torch_dtype

HANDOFF_NAME = re.compile(r"relayrl-\d+-v\d+-pub[0-9a-f]{16}")
SPARES = "relayrl-*-v0-spare*"  # glob; v0 so the orphan sweep (relayrl-<pid>-v*) takes them
MAX_SPARES = 2


def handoff_name(version: int) -> str:
    return f"relayrl-{os.getpid()}-v{version}-pub{uuid.uuid4().hex[:16]}"


class StagedVersion:
    """A version written into a handoff file of its own, before and after the relay takes it
    over (by renaming: the inode, and so this mapping, stays the same). Held by whoever
    `retain`s it until each `release`s it; the last release unmaps it and drops the lock."""

    def __init__(self, manifest: Manifest, path: str, fd: int):
        self.manifest = manifest
        self.path = path
        self._fd: int | None = fd
        fcntl.flock(fd, fcntl.LOCK_SH)  # before any relay sees it: never recycled while held
        self._map = mmap.mmap(fd, max(flat_size(manifest), 1))
        self._holders = 1
        self._lock = threading.Lock()

    @classmethod
    def write(cls, shm_dir: str, version: int, step: int, tensors: dict[str, torch.Tensor],
              dtype: torch.dtype | None = None) -> StagedVersion:
        """`tensors` (CPU), floating-point ones cast to `dtype` one tensor at a time, written
        at their layout offsets into a new handoff file in `shm_dir`, checksummed on the way.
        OSError when the file cannot be had; nothing is left at its path then."""
        cast = {name: dtype if dtype is not None and t.is_floating_point() else t.dtype
                for name, t in tensors.items()}
        sized = Manifest(version, step, tuple(
            ShardInfo(name, str(cast[name]).removeprefix("torch."), tuple(t.shape),
                      t.numel() * cast[name].itemsize, "") for name, t in tensors.items()))
        path = os.path.join(shm_dir, handoff_name(version))
        fd = claim_file(path, flat_size(sized))
        shards = []
        try:
            for info, offset in zip(sized.shards, shard_offsets(sized).values(), strict=True):
                t = tensors[info.name].detach()
                data = tensor_bytes(t.to(cast[info.name]) if t.dtype != cast[info.name] else t)
                _write_all(fd, data, offset)
                shards.append(ShardInfo(info.name, info.dtype, info.shape, info.nbytes,
                                        checksum(data)))
            return cls(Manifest(version, step, tuple(shards)), path, fd)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def step(self) -> int:
        return self.manifest.step

    @property
    def nbytes(self) -> int:
        return self.manifest.total_bytes

    def tensors(self) -> dict[str, torch.Tensor]:
        """The version's tensors, viewing the file (no copy); valid while it is held."""
        flat = torch.frombuffer(self._map, dtype=torch.uint8)
        return {s.name: flat[off:off + s.nbytes].view(torch_dtype(s.dtype)).view(s.shape)
                for s, off in zip(self.manifest.shards, shard_offsets(self.manifest).values(),
                                  strict=True)}

    def retain(self) -> StagedVersion:
        with self._lock:
            assert self._holders > 0, "retained after its last release"
            self._holders += 1
        return self

    def release(self) -> None:
        """One holder less. The last one removes the file if no relay took it over, closes
        it and leaves the mapping to its last tensor (the lock goes with the file)."""
        with self._lock:
            self._holders -= 1
            if self._holders:
                return
            fd, self._fd = self._fd, None
        with contextlib.suppress(FileNotFoundError):  # gone if the relay took it over
            os.unlink(self.path)
        if fd is not None:
            os.close(fd)
        self._map = None


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def claim_file(path: str, size: int) -> int:
    """An O_RDWR descriptor of a new file at `path` of `size` bytes (at least 1): a spare
    in its directory renamed there when one is waiting, else a new file. The bytes between
    shards are not defined (the layout's gaps, which no checksum covers). On an error
    nothing is left at `path`."""
    for spare in glob.glob(os.path.join(os.path.dirname(path), SPARES)):
        fd = _take_spare(spare, path)
        if fd is not None:
            break
    else:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, max(size, 1))
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    return fd


def _take_spare(spare: str, path: str) -> int | None:
    """`spare` renamed to `path` and opened, or None: another claimant took it first, or it
    is not a regular file of ours (given its name back, for its owner)."""
    try:
        os.rename(spare, path)  # atomic: of two claimants one wins, the other moves on
    except OSError:
        return None
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        fd = None
    if fd is not None:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
            return fd
        os.close(fd)
    os.rename(path, spare)
    return None


def recycle(path: str) -> None:
    """Let go of a version's file: kept as a spare for the next version while fewer than
    MAX_SPARES wait and no process holds it (StagedVersion's lock), else removed."""
    shm_dir = os.path.dirname(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            free = True
        except BlockingIOError:
            free = False
        if free and len(glob.glob(os.path.join(shm_dir, SPARES))) < MAX_SPARES:
            os.rename(path, os.path.join(shm_dir, f"relayrl-{os.getpid()}-v0-spare"
                                                  f"{uuid.uuid4().hex[:16]}"))
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def remove_spares(shm_dir: str, pid: int) -> None:
    """The spares `pid` left (a relay closing), so a stopped run leaves shm_dir as it was."""
    for spare in glob.glob(os.path.join(shm_dir, f"relayrl-{pid}-v0-spare*")):
        try:
            os.unlink(spare)
        except FileNotFoundError:
            pass
