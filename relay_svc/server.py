"""The Relay gRPC service over an in-memory VersionStore."""

from __future__ import annotations

import itertools
import logging
import threading

import grpc

from relay_svc.delta_cache import DeltaCache, Whole
from relay_svc.follower import Follower
from relay_svc.planes import RelayPlanes
from relay_svc.rendezvous import RendezvousTimeout, UnknownRendezvous
from relay_svc.stored_version import HandoffRefused
from relay_svc.telemetry import relay_metrics
from relay_svc.version_store import AlreadyHeld, VersionStore
from relayrl.config import RelayRun
from relayrl.config.relay import RelayConfig
from relayrl.contracts.proto.v1 import relay_pb2, relay_pb2_grpc
from relayrl.runtime.logs import setup_logging
from relayrl.runtime.service import ServiceRunner
from relayrl_torch.weights import Manifest, WeightError
from relayrl_torch.weights.hostid import host_id
from relayrl_torch.weights.signing import UNSIGNED, ManifestKeys, SignatureError
from relayrl_torch.weights.wire import with_fast_pull_bytes

log = logging.getLogger(__name__)
DEFAULT_MAX_GAP = RelayConfig.model_fields["max_version_gap"].default


class RelayServicer(relay_pb2_grpc.RelayServicer):
    """Publish takes versions from the trainer's token alone (relayrl.runtime.roles): the first any,
    then each newer than the latest and at most `max_gap` past it. A version is immutable:
    the same version with the same manifest again (a retry whose reply was lost, a resumed
    trainer's bit-exact replay) answers OK and changes nothing; other weights are refused.

    With the trainer's public key (`keys`), a publish whose manifest the trainer did not sign
    is refused, the first one after a start included, so no token holder can plant a version
    far ahead of the trainer's. Every version taken is then the trainer's own, and `max_gap`
    is not applied: it bounds a stray version, and it would let an old signed version,
    published again to a fresh relay, shut out the trainer's next."""

    def __init__(self, store: VersionStore, chunk_bytes: int, planes: RelayPlanes | None = None,
                 stall_timeout_s: float = 60.0, max_gap: int | None = DEFAULT_MAX_GAP,
                 upstream: list[str] | None = None, keys: ManifestKeys = UNSIGNED,
                 deltas: DeltaCache | None = None):
        self.store = store
        self.deltas = deltas or DeltaCache(store, 0)
        self.chunk_bytes = chunk_bytes
        self.planes = planes or RelayPlanes(["grpc"], "127.0.0.1", stall_timeout_s)
        self.stall_timeout_s = stall_timeout_s
        self.max_gap = max_gap
        self.upstream = upstream or []
        self.keys = keys

    def Publish(self, request_iterator, context):
        if self.upstream:  # its versions come from upstream; a second source would fork them
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"Publish: this relay follows {', '.join(self.upstream)} "
                          "(relay.upstream); publish to the root relay")
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("payload") != "manifest":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "Publish: the first message must carry the manifest")
        second = next(request_iterator, None)
        handoff = (second.shm if second is not None and second.WhichOneof("payload") == "shm"
                   else None)
        try:
            if handoff is not None and handoff.host_id != host_id():
                raise HandoffRefused("Publish.shm.host_id: the publisher is not on this "
                                     "relay's host; send the bytes over gRPC")
            manifest = self.keys.verify(Manifest.from_proto(first.manifest), "Publish")
            stored = self.store.begin(manifest, None if self.keys.checks else self.max_gap,
                                      handoff.file_name if handoff is not None else None)
        except SignatureError as err:
            self.store.count_refused_signature()
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(err))
        except AlreadyHeld as err:
            for _ in request_iterator:  # the same bytes again: read to the end, keep none
                pass
            log.info("%s (a retried publish, or a resumed trainer's replay)", err)
            return relay_pb2.PublishResponse(version=first.manifest.version, bytes_received=0)
        except HandoffRefused as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except WeightError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Publish: {err}")
        rest = request_iterator if handoff is not None or second is None else itertools.chain(
            [second], request_iterator)
        try:
            for msg in rest:
                if handoff is not None or msg.WhichOneof("payload") != "chunk":
                    raise WeightError("a publish is the manifest, then chunks or one shm "
                                      f"handoff alone; got {msg.WhichOneof('payload')} after "
                                      f"{'the handoff' if handoff is not None else 'it'}")
                stored.write_shard(msg.chunk.shard, msg.chunk.offset, msg.chunk.data)
            self.store.commit(stored)
        except WeightError as err:
            self.store.abort(stored, str(err))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Publish: {err}")
        except BaseException:  # the publisher went away mid-stream
            self.store.abort(stored, "publisher disconnected")
            raise
        log.info("version %d (step %d, %d bytes) stored", stored.version,
                 stored.manifest.step, stored.size)
        return relay_pb2.PublishResponse(version=stored.version, bytes_received=stored.filled)

    def GetManifest(self, request, context):
        try:
            manifest = self.store.manifest(request.version)
        except WeightError as err:
            context.abort(grpc.StatusCode.NOT_FOUND, str(err))
        if manifest is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no version has been published yet")
        return manifest.to_proto()

    def _stored(self, version: int, context, complete: bool):
        try:
            return self.store.get(version, complete=complete)
        except WeightError as err:
            context.abort(grpc.StatusCode.NOT_FOUND, str(err))

    def Pull(self, request, context):
        stored = self._stored(request.version, context, complete=False)
        wanted = list(request.shards) or [s.name for s in stored.manifest.shards]
        for name in wanted:
            if name not in stored.offsets:
                context.abort(grpc.StatusCode.NOT_FOUND,
                              f"version {stored.version} has no shard {name!r}")
        self.store.count_pull(stored.size)
        try:
            for name in wanted:
                start, info = stored.offsets[name], stored.manifest.shard(name)
                off = 0
                for piece in stored.read(start, start + info.nbytes, self.chunk_bytes,
                                         self.stall_timeout_s):
                    yield relay_pb2.ShardChunk(shard=name, offset=off, data=bytes(piece))
                    off += len(piece)
                if not info.nbytes:
                    yield relay_pb2.ShardChunk(shard=name, offset=0, data=b"")
        except WeightError as err:
            context.abort(grpc.StatusCode.ABORTED, str(err))

    def PullBytes(self, request, context):
        stored = self._stored(request.version, context, complete=False)
        self.store.count_pull(stored.size)
        try:
            yield from stored.read(request.start, request.end, self.chunk_bytes,
                                   self.stall_timeout_s)
        except WeightError as err:
            context.abort(grpc.StatusCode.ABORTED, str(err))

    def PullDelta(self, request, context):
        """The header (delta or whole), then its bytes in chunks."""
        target = self._stored(request.version, context, complete=True)
        answer = (self.deltas.get(request.base_version, target.version) if request.base_version
                  else Whole("the worker holds no version"))
        self.deltas.count(answer)
        if isinstance(answer, Whole):
            self.store.count_pull(target.size)
            yield relay_pb2.DeltaChunk(header=relay_pb2.DeltaHeader(
                version=target.version, payload_bytes=target.size,
                whole_reason=answer.reason))
            yield from target.read(0, target.size, self.chunk_bytes, self.stall_timeout_s)
            return
        self.store.count_pull(answer.nbytes)
        yield relay_pb2.DeltaChunk(header=answer.header())
        view = memoryview(answer.payload)
        for start in range(0, answer.nbytes, self.chunk_bytes):
            yield view[start:start + self.chunk_bytes]

    def OpenPull(self, request, context):
        stored = self._stored(request.version, context, complete=True)
        try:
            ticket = self.planes.open(stored, request)
        except WeightError as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"OpenPull: {err}")
        self.store.count_pull(stored.size)
        return ticket

    def ClosePull(self, request, context):
        self.planes.close(request)
        return relay_pb2.ClosePullResponse()

    def Rendezvous(self, request, context):
        try:
            return self.planes.rendezvous.serve(request)
        except UnknownRendezvous as err:
            context.abort(grpc.StatusCode.NOT_FOUND, str(err))
        except RendezvousTimeout as err:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(err))
        except WeightError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))

    def ListVersions(self, request, context):
        s = self.store.stats
        return relay_pb2.ListVersionsResponse(
            versions=self.store.versions(), pending_version=self.store.pending_version(),
            versions_published=s.versions_published, pulls_served=s.pulls_served,
            bytes_served=s.bytes_served, failed_publishes=s.failed_publishes)


def add_relay_servicer(servicer: RelayServicer, server: grpc.Server) -> None:
    with_fast_pull_bytes(relay_pb2_grpc.add_RelayServicer_to_server, servicer, server)


def serve(cfg: RelayRun) -> None:
    setup_logging("relay")
    rc = cfg.relay
    planes = RelayPlanes(rc.data_planes, rc.endpoint.host, rc.timeout_s, rc.device,
                         rc.endpoint.bind)  # first:
    # it refuses a plane this machine cannot serve (nccl without CUDA) before anything starts
    store = VersionStore(rc.keep_versions, shm_dir=rc.shm_dir, wait_timeout_s=rc.timeout_s)
    deltas = DeltaCache(store, rc.delta_cache_bytes, rc.timeout_s)
    keys = ManifestKeys.from_config(cfg.auth)
    servicer = RelayServicer(store, rc.chunk_bytes, planes, rc.timeout_s, rc.max_version_gap,
                             rc.upstream, ManifestKeys(verifier=keys.verifier), deltas)
    runner = ServiceRunner("relay", rc.endpoint.bind_address, [(add_relay_servicer, servicer)],
                           relay_metrics(store, deltas), rc.metrics_port,
                           max_receive_bytes=rc.grpc_receive_bytes,
                           max_concurrent_rpcs=rc.grpc.max_concurrent_rpcs)
    follower = None
    if rc.upstream:
        follower = Follower(store, rc.upstream, rc.chunk_bytes, rc.follow_poll_s, rc.timeout_s,
                            ManifestKeys(verifier=keys.verifier))
        threading.Thread(target=follower.run, args=(runner.stop_event,), name="follow",
                         daemon=True).start()
    try:
        runner.run()
    finally:
        planes.shutdown()
        store.close()
