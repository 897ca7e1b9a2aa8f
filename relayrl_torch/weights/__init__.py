"""Versioned, verified policy weights: manifests, the weight-plane contract and the relay
client. The relay's store of versions is its own (relay_svc/version_store.py)."""

from relayrl_torch.weights.manifest import (
    Manifest,
    ShardInfo,
    WeightError,
    build_manifest,
    verify_shard,
)
from relayrl_torch.weights.plane import WeightPlane

__all__ = [
    "Manifest",
    "ShardInfo",
    "WeightError",
    "WeightPlane",
    "build_manifest",
    "verify_shard",
]
