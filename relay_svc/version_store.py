"""In-memory store of the last K versions: the relay service's state and the in-process
implementation of the weight plane."""

from __future__ import annotations

import glob
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from relay_svc.stored_version import State, StoredVersion
from relayrl.config import ConfigError
from relayrl_torch.weights.layout import pack, unpack
from relayrl_torch.weights.manifest import Manifest, WeightError, build_manifest
from relayrl_torch.weights.plane import WeightPlane
from relayrl_torch.weights.shm_handoff import remove_spares


class AlreadyHeld(WeightError):
    """A publish of a version this store already holds with the very same shards: a trainer
    that resumed from a checkpoint replays the steps after it bit-exactly, so it publishes
    again what its previous process published. Nothing to store; not a failure."""


@dataclass
class StoreStats:
    versions_published: int = 0
    failed_publishes: int = 0
    signatures_refused: int = 0
    pulls_served: int = 0
    bytes_served: int = 0


class VersionStore(WeightPlane):
    def __init__(self, keep_versions: int, shm_dir: str | None = None,
                 wait_timeout_s: float = 60.0):
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
        if shm_dir is not None:
            if not os.path.isdir(shm_dir):
                raise ConfigError(f"relay.shm_dir {shm_dir!r} is not a directory")
            _remove_orphaned_segments(shm_dir)
        self.keep = keep_versions
        self.shm_dir = shm_dir
        self.wait_timeout_s = wait_timeout_s
        self.stats = StoreStats()
        self._lock = threading.Lock()
        self._versions: OrderedDict[int, StoredVersion] = OrderedDict()

    # -- writing -------------------------------------------------------------------------

    def begin(self, manifest: Manifest, max_gap: int | None = None,
              adopt: str | None = None) -> StoredVersion:
        """Open a version for writing; readers can follow it from now on. With `max_gap`, a
        version more than that past the newest held is refused (a publish's bound; a
        follower copies whatever its upstream has). `adopt`: a publisher's file in shm_dir
        holding the whole version (StoredVersion), to commit next."""
        with self._lock:
            held = self._versions.get(manifest.version)
            if held is not None and held.state is State.COMPLETE:
                if (held.manifest.step, held.manifest.shards) == (manifest.step, manifest.shards):
                    raise AlreadyHeld(f"version {manifest.version} is already held, identical")
                raise WeightError(
                    f"version {manifest.version} is held with other weights: versions are "
                    "immutable (a trainer resumed from a checkpoint whose replay is not "
                    "bit-exact publishes different weights under the same version)")
            latest = next(reversed(self._versions), 0)
            if (held is not None and held.state is State.PENDING and latest == manifest.version
                    and (held.manifest.step, held.manifest.shards)
                    == (manifest.step, manifest.shards)):
                # a retry of a publish whose first stream this relay has not yet seen end
                # (the publisher's deadline passed while the relay was stalled): it replaces
                # that stream, which fails when it next writes
                held.fail("replaced by a retry of the same publish")
                del self._versions[manifest.version]
                latest = next(reversed(self._versions), 0)
            if manifest.version <= latest:
                raise WeightError(
                    f"version {manifest.version} is not newer than the latest ({latest})")
            if max_gap is not None and latest and manifest.version > latest + max_gap:
                raise WeightError(
                    f"manifest.version {manifest.version} is more than relay.max_version_gap "
                    f"({max_gap}) past the latest version {latest}: at most "
                    f"{latest + max_gap} is taken")
            stored = StoredVersion(manifest, self.shm_dir, adopt)
            self._versions[manifest.version] = stored
        return stored

    def commit(self, stored: StoredVersion) -> None:
        try:
            stored.commit()
        except WeightError:
            self.abort(stored, "")
            raise
        with self._lock:
            self.stats.versions_published += 1
            complete = [v for v, s in self._versions.items() if s.state is State.COMPLETE]
            for v in complete[:-self.keep]:
                self._versions.pop(v).release(recycle_file=True)

    def abort(self, stored: StoredVersion, error: str) -> None:
        stored.fail(error or "aborted")
        with self._lock:
            if self._versions.get(stored.version) is stored:  # counted once: commit aborts
                del self._versions[stored.version]  # too, before its caller does
                self.stats.failed_publishes += 1
        stored.release()

    def publish(self, version: int, step: int, tensors: dict[str, torch.Tensor]) -> Manifest:
        manifest = build_manifest(version, step, tensors)
        try:
            stored = self.begin(manifest)
        except AlreadyHeld:
            return manifest
        pack(manifest, tensors, stored.flat)
        stored.filled = stored.size
        self.commit(stored)
        return manifest

    # -- reading -------------------------------------------------------------------------

    def get(self, version: int, complete: bool = True) -> StoredVersion:
        """The stored `version` (0: the latest); with `complete`, waits until it is."""
        with self._lock:
            live = [s for s in self._versions.values()
                    if s.state is State.COMPLETE or not complete]
            if version == 0:
                if not live:
                    raise WeightError("no version has been published yet")
                stored = live[-1]
            elif version in self._versions:
                stored = self._versions[version]
            else:
                held = [v for v, s in self._versions.items() if s.state is State.COMPLETE]
                where = f"{held[0]}..{held[-1]} (oldest {held[0]})" if held else "nothing"
                raise WeightError(f"version {version} is not held; this relay holds {where}")
        if complete:
            stored.wait_complete(self.wait_timeout_s)
        return stored

    def manifest(self, version: int = 0) -> Manifest | None:
        try:
            return self.get(version, complete=False).manifest
        except WeightError:
            if version == 0:
                return None
            raise

    def pull(self, version: int, staging: torch.Tensor | None = None
             ) -> dict[str, torch.Tensor]:
        stored = self.get(version)
        self.count_pull(stored.size)
        return unpack(stored.manifest, stored.flat.clone())  # callers must not alias the store

    def count_refused_signature(self) -> None:
        with self._lock:
            self.stats.signatures_refused += 1

    def count_pull(self, nbytes: int) -> None:
        with self._lock:
            self.stats.pulls_served += 1
            self.stats.bytes_served += nbytes

    def versions(self) -> list[int]:
        with self._lock:
            return [v for v, s in self._versions.items() if s.state is State.COMPLETE]

    def pending_version(self) -> int:
        with self._lock:
            return next((v for v, s in self._versions.items() if s.state is State.PENDING), 0)

    def close(self) -> None:
        with self._lock:
            for stored in self._versions.values():
                stored.release()
            self._versions.clear()
        if self.shm_dir is not None:
            remove_spares(self.shm_dir, os.getpid())


def _remove_orphaned_segments(shm_dir: str) -> None:
    """Shared-memory files left by relays that died without cleaning up."""
    for path in glob.glob(os.path.join(shm_dir, "relayrl-*-v*")):
        pid = os.path.basename(path).split("-")[1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.unlink(path)
            except OSError:
                pass
