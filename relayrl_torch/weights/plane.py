"""The weight-plane contract. The relay's in-process VersionStore (relay_svc/version_store.py)
and the gRPC RelayClient both implement it, and the same contract test runs against both."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from relayrl_torch.weights.manifest import Manifest
from relayrl_torch.weights.shm_handoff import StagedVersion


class WeightPlane(ABC):
    # what pulls moved: the last one's bytes (a delta's payload, or the whole version; 0 in a
    # process that holds the versions itself), and deltas applied and refused
    last_pull_bytes: int = 0
    deltas_applied: int = 0
    deltas_refused: int = 0

    @abstractmethod
    def publish(self, version: int, step: int, tensors: dict[str, torch.Tensor]) -> Manifest:
        """Store a new immutable version; versions must increase."""

    def stage(self, version: int, step: int, tensors: dict[str, torch.Tensor],
              dtype: torch.dtype | None = None) -> StagedVersion | None:
        """The version written where this plane takes it from without another copy
        (relayrl_torch.weights.shm_handoff), to send with send_staged; None where a plane has no
        such place (the caller then snapshots and publishes)."""
        return None

    def send_staged(self, staged: StagedVersion) -> Manifest:
        raise NotImplementedError(f"{type(self).__name__} stages no versions")

    @abstractmethod
    def manifest(self, version: int = 0) -> Manifest | None:
        """The manifest of `version`, or of the latest when 0; None when nothing is published."""

    @abstractmethod
    def pull(self, version: int, staging: torch.Tensor | None = None
             ) -> dict[str, torch.Tensor]:
        """Every shard of `version` (0: the latest), each verified against the manifest.
        `staging` is a uint8 buffer the caller reuses across pulls, where a plane can use it."""

    @abstractmethod
    def versions(self) -> list[int]:
        """Versions held, oldest first."""
