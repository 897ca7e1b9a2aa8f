"""In-memory store of the last K versions: the relay service's state and the in-process
implementation of the weight plane."""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from relayrl.weights.manifest import Manifest, WeightError, build_manifest, verify_shard
from relayrl.weights.plane import WeightPlane


class VersionStore(WeightPlane):
    def __init__(self, keep_versions: int):
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
        self.keep = keep_versions
        self._lock = threading.Lock()
        self._versions: OrderedDict[int, tuple[Manifest, dict[str, bytes]]] = OrderedDict()

    def put(self, manifest: Manifest, shards: dict[str, bytes]) -> None:
        """Insert a version whose bytes were received elsewhere; every shard is verified."""
        names = {s.name for s in manifest.shards}
        if set(shards) != names:
            missing, extra = names - set(shards), set(shards) - names
            raise WeightError(f"version {manifest.version}: missing shards {sorted(missing)}, "
                              f"unexpected {sorted(extra)}")
        for info in manifest.shards:
            verify_shard(info, shards[info.name])
        with self._lock:
            latest = next(reversed(self._versions), 0)
            if manifest.version <= latest:
                raise WeightError(
                    f"version {manifest.version} is not newer than the latest ({latest})")
            self._versions[manifest.version] = (manifest, shards)
            while len(self._versions) > self.keep:
                self._versions.popitem(last=False)

    def publish(self, version: int, step: int, tensors: dict[str, torch.Tensor]) -> Manifest:
        manifest = build_manifest(version, step, tensors)
        shards = {n: t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                  for n, t in tensors.items()}
        self.put(manifest, shards)
        return manifest

    def _get(self, version: int) -> tuple[Manifest, dict[str, bytes]]:
        with self._lock:
            if not self._versions:
                raise WeightError("no version has been published yet")
            if version == 0:
                return next(reversed(self._versions.values()))
            if version not in self._versions:
                oldest, newest = next(iter(self._versions)), next(reversed(self._versions))
                raise WeightError(f"version {version} is not held; this relay holds "
                                  f"{oldest}..{newest} (oldest {oldest})")
            return self._versions[version]

    def manifest(self, version: int = 0) -> Manifest | None:
        try:
            return self._get(version)[0]
        except WeightError:
            if version == 0:
                return None
            raise

    def shard_bytes(self, version: int) -> tuple[Manifest, dict[str, bytes]]:
        return self._get(version)

    def pull(self, version: int) -> dict[str, torch.Tensor]:
        manifest, shards = self._get(version)
        return {s.name: verify_shard(s, shards[s.name]) for s in manifest.shards}

    def versions(self) -> list[int]:
        with self._lock:
            return list(self._versions)
