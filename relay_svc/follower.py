"""A relay that follows an upstream relay: it opens each new version locally as soon as the
upstream announces it and writes the bytes as they stream in, so its own readers are served
while the version is still arriving (pipelined, not store-then-forward)."""

from __future__ import annotations

import logging
import threading
import time

import grpc

from relay_svc.version_store import VersionStore
from relayrl.config import ConfigError
from relayrl.contracts.proto.v1 import relay_pb2, relay_pb2_grpc
from relayrl.runtime.grpc_util import channel
from relayrl_torch.weights import Manifest, WeightError
from relayrl_torch.weights.signing import UNSIGNED, ManifestKeys, SignatureError
from relayrl_torch.weights.wire import decode_bytes_chunk

log = logging.getLogger(__name__)


class Follower:
    """With the trainer's public key (`keys`), a version whose manifest the trainer did not
    sign is not copied (a forged version upstream would otherwise stand above the
    trainer's real ones here too); the signature is kept as it came, for this relay's
    readers to verify."""

    def __init__(self, store: VersionStore, upstreams: list[str], chunk_bytes: int,
                 poll_s: float, timeout_s: float, keys: ManifestKeys = UNSIGNED):
        if not upstreams:
            raise ConfigError("relay.upstream: a follower needs at least one upstream relay")
        self.store = store
        self.upstreams = upstreams
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self.failures = 0
        self.keys = keys
        self._refused = 0  # the last version refused for its signature, logged once
        self._channels = [channel(a) for a in upstreams]
        self._stubs = [relay_pb2_grpc.RelayStub(c) for c in self._channels]
        self._pull = [c.unary_stream("/relayrl.v1.Relay/PullBytes",
                                     request_serializer=relay_pb2.PullBytesRequest.SerializeToString,
                                     response_deserializer=decode_bytes_chunk)
                      for c in self._channels]

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self.follow_once():
                stop.wait(self.poll_s)

    def follow_once(self) -> bool:
        """Copy the newest upstream version if it is newer than ours; True if one came."""
        for i, address in enumerate(self.upstreams):
            try:
                manifest = Manifest.from_proto(self._stubs[i].GetManifest(
                    relay_pb2.GetManifestRequest(version=0), timeout=self.timeout_s))
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    log.debug("upstream %s unavailable: %s", address, err.code())
                continue
            latest = max(self.store.versions() + [self.store.pending_version()], default=0)
            if manifest.version <= latest:
                return False
            try:
                self.keys.verify(manifest, f"upstream {address}")
            except SignatureError as err:
                if manifest.version != self._refused:
                    self._refused = manifest.version
                    self.store.count_refused_signature()
                    log.warning("not following: %s", err)
                continue
            return self._copy(i, manifest)
        return False

    def _copy(self, i: int, manifest: Manifest) -> bool:
        t0 = time.monotonic()
        stored = self.store.begin(manifest)
        try:
            request = relay_pb2.PullBytesRequest(version=manifest.version)
            for piece in self._pull[i](request, timeout=self.timeout_s):
                stored.write_flat(stored.filled, piece)
            self.store.commit(stored)
        except (grpc.RpcError, WeightError) as err:
            self.failures += 1
            self.store.abort(stored, f"upstream {self.upstreams[i]}: {err}")
            log.warning("following version %d from %s failed: %s", manifest.version,
                        self.upstreams[i], err)
            return False
        log.info("version %d followed from %s in %.0f ms", manifest.version, self.upstreams[i],
                 1e3 * (time.monotonic() - t0))
        return True
