"""Versioned, verified policy weights: manifests, the in-process store and the relay client."""

from relayrl.weights.manifest import Manifest, ShardInfo, WeightError, build_manifest, verify_shard
from relayrl.weights.plane import WeightPlane
from relayrl.weights.store import VersionStore

__all__ = [
    "Manifest",
    "ShardInfo",
    "VersionStore",
    "WeightError",
    "WeightPlane",
    "build_manifest",
    "verify_shard",
]
