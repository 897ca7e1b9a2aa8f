"""The networked implementation of the weight plane: gRPC to a relay for control, and one of
several data planes for the bytes of a version's flat buffer."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import grpc
import torch

from relayrl.contracts.proto.v1 import relay_pb2, relay_pb2_grpc
from relayrl.runtime.deadlines import CONTROL_CALL_S, TRANSFER_S
from relayrl.runtime.grpc_util import channel
from relayrl_torch.weights import delta, fetchers
from relayrl_torch.weights.hostid import host_id
from relayrl_torch.weights.layout import flat_size, unpack, views
from relayrl_torch.weights.manifest import Manifest, WeightError, build_manifest, tensor_bytes
from relayrl_torch.weights.plane import WeightPlane
from relayrl_torch.weights.rendezvous import split_address
from relayrl_torch.weights.shm_handoff import StagedVersion
from relayrl_torch.weights.signing import UNSIGNED, ManifestKeys, SignatureError
from relayrl_torch.weights.wire import (
    decode_bytes_chunk,
    decode_delta_chunk,
    encode_publish_chunk,
    iter_chunks,
)

log = logging.getLogger(__name__)
DATA_PLANES = ("grpc", "shm", "torch_dist", "nixl", "nccl", "vllm")


class RelayClient(WeightPlane):
    """`device`: where the nccl plane receives (a GPU, from collective.worker_device; a test's
    CPU has gloo stand in); the other planes receive into host memory and ignore it.
    `publish_shm_dir`: the relay's shm_dir, to publish through shared memory
    (relayrl_torch.weights.shm_handoff); a relay that cannot take a handoff gets the bytes over
    gRPC instead, from then on. `keys`: the trainer's signing key, which signs what this
    client publishes, and its public key, which every manifest a relay sends must verify
    against (relayrl_torch.weights.signing); `signatures_refused` counts those that did not.

    `deltas`: over gRPC, pull a version as the changes since the one last pulled
    (relayrl_torch.weights.delta), applied in the receive buffer that still holds it; the relay
    answers whole where it cannot. A delta that does not fit, or whose result fails the
    manifest's checksums, is refused (`deltas_refused`) and the whole version pulled."""

    def __init__(self, address: str, chunk_bytes: int = 1 << 20, timeout_s: float = TRANSFER_S,
                 plane: str = "grpc", device: torch.device | None = None,
                 publish_shm_dir: str | None = None, keys: ManifestKeys = UNSIGNED,
                 deltas: bool = True):
        if plane not in DATA_PLANES:
            raise ValueError(f"data plane must be one of {DATA_PLANES}, got {plane!r}")
        if plane == "nccl" and device is None:
            raise ValueError("RelayClient: the nccl plane needs the device to receive on")
        self.device = device
        self.address = address
        self.chunk_bytes = chunk_bytes
        self.timeout_s = timeout_s
        self.plane = plane
        self.publish_shm_dir = publish_shm_dir
        self.keys = keys
        self.signatures_refused = 0
        self.deltas = deltas
        self.deltas_applied = 0
        self.deltas_refused = 0
        self.last_pull_bytes = 0  # what the last pull moved: a delta's payload, or the whole
        self._held: tuple[Manifest, torch.Tensor] | None = None  # the last gRPC pull, verified
        self._channel = channel(address)  # a trainer's publishes carry its own token
        self._stub = relay_pb2_grpc.RelayStub(self._channel)
        self._pull_bytes = self._channel.unary_stream(
            "/relayrl.v1.Relay/PullBytes",
            request_serializer=relay_pb2.PullBytesRequest.SerializeToString,
            response_deserializer=decode_bytes_chunk)
        self._pull_delta = self._channel.unary_stream(
            "/relayrl.v1.Relay/PullDelta",
            request_serializer=relay_pb2.PullDeltaRequest.SerializeToString,
            response_deserializer=decode_delta_chunk)
        self._publish_raw = self._channel.stream_unary(
            "/relayrl.v1.Relay/Publish", request_serializer=lambda raw: raw,
            response_deserializer=relay_pb2.PublishResponse.FromString)
        self._nixl: fetchers.NixlFetcher | None = None

    def close(self) -> None:
        self._channel.close()

    def _error(self, what: str, err: grpc.RpcError) -> WeightError:
        """Raised `from err`: relayrl.runtime.outage.is_outage reads the status code of the
        cause."""
        return WeightError(f"{what} ({self.address}, {self.plane}): {err.details()}")

    # -- publishing ----------------------------------------------------------------------

    def _messages(self, manifest: Manifest, tensors: dict[str, torch.Tensor]) -> Iterator[bytes]:
        yield relay_pb2.PublishMessage(manifest=manifest.to_proto()).SerializeToString()
        for name, t in tensors.items():
            for offset, piece in iter_chunks(tensor_bytes(t), self.chunk_bytes):
                yield encode_publish_chunk(name, offset, piece)

    def publish(self, version: int, step: int, tensors: dict[str, torch.Tensor]) -> Manifest:
        staged = self.stage(version, step, tensors)
        if staged is not None:
            try:
                return self.send_staged(staged)
            finally:
                staged.release()
        manifest = self.keys.sign(build_manifest(version, step, tensors))
        try:
            self._publish_raw(self._messages(manifest, tensors), timeout=self.timeout_s)
        except grpc.RpcError as err:
            raise self._error(f"publish of version {version}", err) from err
        return manifest

    def stage(self, version: int, step: int, tensors: dict[str, torch.Tensor],
              dtype: torch.dtype | None = None) -> StagedVersion | None:
        """The version written into a handoff file in the relay's shm_dir, for send_staged;
        None when this client does not publish through shared memory, or no file can be
        written here (then never again: publish sends the bytes over gRPC)."""
        if self.publish_shm_dir is None:
            return None
        try:
            return StagedVersion.write(self.publish_shm_dir, version, step, tensors, dtype)
        except OSError as err:  # no such directory here, or it is full
            log.warning("publishing over gRPC from now on: no handoff file can be written in "
                        "%s (%s)", self.publish_shm_dir, err)
            self.publish_shm_dir = None
            return None

    def send_staged(self, staged: StagedVersion) -> Manifest:
        """Hand `staged`'s file to the relay; a relay that cannot take it gets its bytes over
        gRPC instead, read back from the file (and every later version over gRPC, unless
        the file was only gone: a relay that took it and lost it restarting)."""
        manifest = self.keys.sign(staged.manifest)
        handoff = relay_pb2.ShmHandoff(file_name=os.path.basename(staged.path),
                                       host_id=host_id())
        messages = [relay_pb2.PublishMessage(manifest=manifest.to_proto()),
                    relay_pb2.PublishMessage(shm=handoff)]
        try:
            self._stub.Publish(iter(messages), timeout=self.timeout_s)
            return manifest
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise self._error(f"publish of version {manifest.version}", err) from err
            if os.path.exists(staged.path):
                log.warning("publishing over gRPC from now on: the relay at %s takes no "
                            "shared-memory handoff (%s)", self.address, err.details())
                self.publish_shm_dir = None
            else:
                log.warning("version %d goes over gRPC: its file is no longer there to hand "
                            "over (%s)", manifest.version, err.details())
        try:
            self._publish_raw(self._messages(manifest, staged.tensors()), timeout=self.timeout_s)
        except grpc.RpcError as err:
            raise self._error(f"publish of version {manifest.version}", err) from err
        return manifest

    # -- pulling -------------------------------------------------------------------------

    def manifest(self, version: int = 0) -> Manifest | None:
        try:
            m = self._stub.GetManifest(relay_pb2.GetManifestRequest(version=version),
                                       timeout=min(self.timeout_s, CONTROL_CALL_S))
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND and version == 0:
                return None
            raise self._error(f"manifest of version {version}", err) from err
        return self._verified(Manifest.from_proto(m), version)

    def _verified(self, manifest: Manifest, version: int) -> Manifest:
        """The relay's `manifest` for `version` (0: the latest), if it is that version's and
        signed by the trainer: a relay must not pass an older genuine version off as the
        one asked for."""
        if version and manifest.version != version:
            raise WeightError(f"relay {self.address} answered version {version} with the "
                              f"manifest of version {manifest.version}")
        try:
            return self.keys.verify(manifest, f"relay {self.address}")
        except SignatureError:
            self.signatures_refused += 1
            raise

    def pull(self, version: int, staging: torch.Tensor | None = None
             ) -> dict[str, torch.Tensor]:
        """Every shard of `version` (0: the latest), verified. With `staging` (a uint8 buffer
        the caller reuses), the gRPC, shm, torch.distributed and NIXL planes receive into it
        and the tensors view it: fresh memory costs a page fault per 4 KiB, a large share of
        a loopback transfer. The nccl plane's tensors view a fresh buffer on `device`, and
        `staging` holds the host copy their checksums are computed on. The vllm plane has no
        pull: a vLLM engine receives its versions itself (open_vllm)."""
        if self.plane == "vllm":
            raise WeightError("the vllm data plane delivers into a vLLM engine; it has no pull")
        try:
            if self.plane != "grpc":
                manifest, flat = self._pull_ticketed(version, staging)
                self.last_pull_bytes = flat_size(manifest)
                return unpack(manifest, flat, staging)  # nccl: staging holds the host copy
            manifest = self.manifest(version)
            if manifest is None:
                raise WeightError(f"relay {self.address} holds no version")
            held, self._held = self._held, None  # the buffer is rewritten from here on
            if self.deltas and held is not None and held[0].version < manifest.version \
                    and delta.same_layout(held[0], manifest):
                tensors = self._pull_delta_into(manifest, held, staging)
                if tensors is not None:
                    return tensors
            flat = self._pull_grpc(manifest, staging)
            tensors = unpack(manifest, flat)
        except grpc.RpcError as err:
            raise self._error(f"pull of version {version}", err) from err
        self._held = (manifest, flat)
        return tensors

    def _pull_grpc(self, manifest: Manifest, staging: torch.Tensor | None) -> torch.Tensor:
        size = flat_size(manifest)
        flat = _receive_buffer(size, staging)
        request = relay_pb2.PullBytesRequest(version=manifest.version)
        _receive(self._pull_bytes(request, timeout=self.timeout_s), flat, manifest.version)
        self.last_pull_bytes = size
        return flat

    def _pull_delta_into(self, manifest: Manifest, held: tuple[Manifest, torch.Tensor],
                         staging: torch.Tensor | None) -> dict[str, torch.Tensor] | None:
        """`manifest`'s version built on `held` (the version last pulled, and the buffer
        holding it), verified; None when the delta was refused (the caller then pulls the
        version whole). A relay that answers whole has its bytes received here too."""
        base, base_flat = held
        size = flat_size(manifest)
        flat = _receive_buffer(size, staging)
        stream = self._pull_delta(
            relay_pb2.PullDeltaRequest(version=manifest.version, base_version=base.version),
            timeout=self.timeout_s)
        try:
            header = next(stream, None)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            log.warning("the relay at %s sends no deltas; pulling versions whole",
                        self.address)
            self.deltas = False
            return None
        if not isinstance(header, relay_pb2.DeltaHeader) or header.version != manifest.version:
            raise WeightError(f"PullDelta of version {manifest.version}: the relay's answer "
                              "does not start with its header")
        if not header.base_version:  # the relay cannot: the whole version follows
            log.debug("version %d whole: %s", manifest.version, header.whole_reason)
            _receive(stream, flat, manifest.version)
            self.last_pull_bytes = size
            tensors = unpack(manifest, flat)
            self._held = (manifest, flat)
            return tensors
        if not 0 <= header.payload_bytes < size:
            stream.cancel()
            return self._refuse(manifest, f"a payload of {header.payload_bytes} bytes, the "
                                f"whole version has {size}")
        if flat.data_ptr() != base_flat.data_ptr():
            flat.copy_(base_flat[:size])
        try:
            builder = delta.Builder(header, base, manifest, flat)
        except delta.BadDelta as err:
            stream.cancel()
            return self._refuse(manifest, str(err))
        try:  # each shard is built as soon as its code is in, the rest still arriving
            for piece in stream:
                if not isinstance(piece, memoryview):
                    raise WeightError(f"version {manifest.version}: a second header amid "
                                      "the delta")
                builder.feed(piece)
            builder.finish()
        except delta.BadDelta as err:
            stream.cancel()
            return self._refuse(manifest, str(err))
        finally:
            builder.close()
        self.deltas_applied += 1
        self.last_pull_bytes = header.payload_bytes
        self._held = (manifest, flat)
        return views(manifest, flat)  # the builder verified every shard

    def _refuse(self, manifest: Manifest, why: str) -> None:
        """Count and log a refused delta; None, for _pull_delta_into to return."""
        self.deltas_refused += 1
        log.warning("refused the delta to version %d from %s (%s); pulling it whole",
                    manifest.version, self.address, why)
        return None

    def _pull_ticketed(self, version: int, staging: torch.Tensor | None
                       ) -> tuple[Manifest, torch.Tensor]:
        plane = relay_pb2.DataPlane.Value(f"DATA_PLANE_{self.plane.upper()}")
        ticket = self._stub.OpenPull(
            relay_pb2.OpenPullRequest(version=version, plane=plane,
                                      host_id=fetchers.host_id()), timeout=self.timeout_s)
        try:
            manifest = self._verified(Manifest.from_proto(ticket.manifest), version)
            if ticket.flat_size != flat_size(manifest):
                raise WeightError(f"OpenPull: flat_size {ticket.flat_size} does not match the "
                                  f"manifest's layout ({flat_size(manifest)})")
        except WeightError:
            if ticket.WhichOneof("ticket") == "torch_dist":
                fetchers.decline_torch_dist(ticket.torch_dist, self._stub.Rendezvous)
            raise
        if self.plane == "shm":
            return manifest, fetchers.fetch_shm(
                ticket.shm, _receive_buffer(ticket.flat_size, staging))
        if self.plane == "torch_dist":
            return manifest, fetchers.fetch_torch_dist(
                ticket.torch_dist, _receive_buffer(ticket.flat_size, staging),
                self._stub.Rendezvous, split_address(self.address))
        if self.plane == "nccl":  # a fresh buffer: the engine may keep the tensors it gets
            return manifest, fetchers.fetch_torch_dist(
                ticket.torch_dist,
                torch.empty(ticket.flat_size, dtype=torch.uint8, device=self.device),
                self._stub.Rendezvous, split_address(self.address))
        if self._nixl is None:
            self._nixl = fetchers.NixlFetcher()
        try:
            return manifest, self._nixl.fetch(ticket.nixl, ticket.flat_size, self.timeout_s,
                                              staging)
        finally:
            self._stub.ClosePull(relay_pb2.ClosePullRequest(
                version=manifest.version, plane=plane, agent_name=self._nixl.name),
                timeout=self.timeout_s)

    def open_vllm(self, version: int, ranks: int, aliases: dict[str, str], gpu_uuid: str = ""
                  ) -> tuple[Manifest, relay_pb2.PullTicket]:
        """A ticket to receive `version` through vLLM's weight-transfer engines: CUDA IPC
        with `gpu_uuid` (the worker's GPU, which must be the relay's), else NCCL to `ranks`
        receiving ranks; `aliases` (name -> shard) are sent after the shards. The relay's
        manifest comes with it, checked."""
        request = relay_pb2.OpenPullRequest(
            version=version, plane=relay_pb2.DATA_PLANE_VLLM, host_id=fetchers.host_id(),
            gpu_uuid=gpu_uuid, ranks=ranks,
            aliases=[relay_pb2.ShardAlias(name=n, shard=s) for n, s in aliases.items()])
        try:
            ticket = self._stub.OpenPull(request, timeout=self.timeout_s)
        except grpc.RpcError as err:
            raise self._error(f"vLLM pull of version {version}", err) from err
        which = ticket.WhichOneof("ticket")
        if which != ("vllm_ipc" if gpu_uuid else "vllm_nccl"):
            raise WeightError(f"OpenPull: asked for {'IPC' if gpu_uuid else 'NCCL'}, the relay "
                              f"answered with a {which} ticket")
        return self._verified(Manifest.from_proto(ticket.manifest), version), ticket

    def close_vllm(self, version: int, pull_id: str) -> None:
        """The relay may let go of what it held for an IPC pull."""
        self._stub.ClosePull(relay_pb2.ClosePullRequest(
            version=version, plane=relay_pb2.DATA_PLANE_VLLM, agent_name=pull_id),
            timeout=self.timeout_s)

    def versions(self) -> list[int]:
        resp = self._stub.ListVersions(relay_pb2.ListVersionsRequest(), timeout=self.timeout_s)
        return list(resp.versions)


def _receive(pieces: Iterator[memoryview], out: torch.Tensor, version: int) -> None:
    """Fill the uint8 buffer `out` from `pieces`, exactly."""
    view, pos, size = memoryview(out.numpy()), 0, out.numel()
    for piece in pieces:
        if not isinstance(piece, memoryview):
            raise WeightError(f"version {version}: a second header amid the bytes")
        end = pos + len(piece)
        if end > size:
            raise WeightError(f"version {version}: relay sent more than its {size} bytes")
        view[pos:end] = piece
        pos = end
    if pos != size:
        raise WeightError(f"version {version}: received {pos} of {size} bytes")


def _receive_buffer(size: int, staging: torch.Tensor | None) -> torch.Tensor:
    if staging is not None and staging.numel() >= size:
        return staging[:size]
    return torch.empty(size, dtype=torch.uint8)
