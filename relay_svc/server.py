"""The Relay gRPC service over an in-memory VersionStore."""

from __future__ import annotations

import logging

import grpc

from relayrl.config import RunConfig
from relayrl.logs import setup_logging
from relayrl.proto.v1 import relay_pb2, relay_pb2_grpc
from relayrl.service import ServiceRunner
from relayrl.weights import Manifest, VersionStore, WeightError
from relayrl.weights.chunks import ShardAssembler, iter_chunks

log = logging.getLogger(__name__)


class RelayServicer(relay_pb2_grpc.RelayServicer):
    def __init__(self, store: VersionStore, chunk_bytes: int):
        self.store = store
        self.chunk_bytes = chunk_bytes

    def Publish(self, request_iterator, context):
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("payload") != "manifest":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "Publish: the first message must carry the manifest")
        try:
            manifest = Manifest.from_proto(first.manifest)
        except WeightError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Publish: {err}")
        assembler = ShardAssembler(manifest)
        try:
            for msg in request_iterator:
                if msg.WhichOneof("payload") != "chunk":
                    raise WeightError("only the first message may carry a manifest")
                assembler.add(msg.chunk)
        except WeightError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Publish: {err}")
        try:
            buffers = assembler.finish()
            self.store.put(manifest, {k: bytes(v) for k, v in buffers.items()})
        except WeightError as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"Publish: {err}")
        log.info("version %d (step %d, %d bytes) stored", manifest.version, manifest.step,
                 assembler.received)
        return relay_pb2.PublishResponse(version=manifest.version,
                                         bytes_received=assembler.received)

    def GetManifest(self, request, context):
        try:
            manifest = self.store.manifest(request.version)
        except WeightError as err:
            context.abort(grpc.StatusCode.NOT_FOUND, str(err))
        if manifest is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no version has been published yet")
        return manifest.to_proto()

    def Pull(self, request, context):
        try:
            manifest, shards = self.store.shard_bytes(request.version)
        except WeightError as err:
            context.abort(grpc.StatusCode.NOT_FOUND, str(err))
        wanted = list(request.shards) or [s.name for s in manifest.shards]
        for name in wanted:
            if name not in shards:
                context.abort(grpc.StatusCode.NOT_FOUND,
                              f"version {manifest.version} has no shard {name!r}")
        for name in wanted:
            yield from iter_chunks(name, shards[name], self.chunk_bytes)

    def ListVersions(self, request, context):
        return relay_pb2.ListVersionsResponse(versions=self.store.versions())


def serve(cfg: RunConfig) -> None:
    setup_logging("relay")
    store = VersionStore(cfg.relay.keep_versions)
    servicer = RelayServicer(store, cfg.relay.chunk_bytes)
    runner = ServiceRunner("relay", cfg.relay.endpoint.address,
                           [(relay_pb2_grpc.add_RelayServicer_to_server, servicer)])
    runner.run()
