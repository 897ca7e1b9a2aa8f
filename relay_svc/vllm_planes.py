"""The relay's side of vLLM's weight-transfer engines (the `vllm` data plane): a version's copy
on the relay's GPU goes straight into a vLLM worker's parameters, over CUDA IPC where the
worker is on the relay's GPU and over NCCL where it is on another.

vLLM ships these engines for RL (vllm/distributed/weight_transfer/): a trainer-side engine
sends a `WeightSource` of named tensors; the worker's engine receives them into its model
through layer-by-layer reloading. Here the relay is vLLM's "trainer" and the worker drives
its own side: it asked for the pull (OpenPull), and calls its engine's init, start, update
and finish itself, while the relay's engine broadcasts (NCCL) or shares handles (IPC). The
manifest, the version order and the checksums stay RelayRL's, on gRPC: the worker checks the
manifest and the version before it receives, the relay checked its GPU copy against the
manifest when it made it (StoredVersion.on_device), and sends only that copy.

vLLM is imported only here, and only on the relay that serves the plane (a GPU relay with
vLLM installed). Every transfer has a deadline: past it the relay aborts its NCCL
communicator (a worker that died mid-transfer must not hold the relay's thread and GPU copy
for ever) or drops its IPC shares.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
from collections.abc import Iterator

import torch

from relayrl.contracts.proto.v1 import relay_pb2
from relayrl_torch.weights import WeightError
from relayrl_torch.weights.manifest import Manifest

log = logging.getLogger(__name__)

# Each side of an NCCL transfer holds this many packed buffers of this size on its GPU while
# it runs (vLLM's defaults are two of 1 GiB); both sides must agree, so the ticket carries it.
PACKED_BUFFER_BYTES = 256 << 20
PACKED_BUFFERS = 2
MAX_ALIASES = 64  # a model ties a few tensors, never many
# One NCCL send at a time: each holds its packed buffers on the relay's GPU, and a worker
# waits its turn inside its engine's receive, within the transfer's deadline.
_SENDING = threading.Semaphore(1)


def checked_aliases(manifest: Manifest, aliases) -> list[tuple[str, str]]:
    """(alias, shard) pairs a worker asked for, each naming a shard of the manifest under a
    name it does not already hold. WeightError naming the field otherwise."""
    names = {s.name for s in manifest.shards}
    if len(aliases) > MAX_ALIASES:
        raise WeightError(f"OpenPull.aliases: {len(aliases)}, at most {MAX_ALIASES}")
    out, seen = [], set(names)
    for a in aliases:
        if a.shard not in names:
            raise WeightError(f"OpenPull.aliases: {a.name!r} names shard {a.shard!r}, which "
                              f"version {manifest.version} does not hold")
        if not a.name or len(a.name) > 512 or a.name in seen:
            raise WeightError(f"OpenPull.aliases: {a.name[:80]!r} is empty, over 512 "
                              "characters, or a name the version or another alias has")
        seen.add(a.name)
        out.append((a.name, a.shard))
    return out


def source_tensors(manifest: Manifest, tensors: dict[str, torch.Tensor],
                   aliases: list[tuple[str, str]]) -> list[tuple[str, torch.Tensor]]:
    """What is sent, in order: every shard in manifest order, then each alias (a view of
    its shard); the worker builds its update from the same manifest and aliases."""
    return [(s.name, tensors[s.name]) for s in manifest.shards] + [
        (alias, tensors[shard]) for alias, shard in aliases]


def source(pairs: list[tuple[str, torch.Tensor]]):
    """A vllm WeightSource yielding `pairs` (name, tensor) each round, its metadata theirs."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class Source(WeightSource):
        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in pairs]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            return iter(pairs)

    return Source()


class WorkerDriven:
    """vLLM's VLLMWeightSyncClient, for a sender whose receiver drives its own side: the
    worker calls its engine's init, start, update and finish itself, so the relay's engine
    has nothing to ask of it."""

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        pass

    def start_weight_update(self) -> None:
        pass

    def update_weights(self, update_info) -> None:
        pass

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        pass


def nccl_ticket(pairs: list[tuple[str, torch.Tensor]], device: torch.device, host: str,
                bind: str, ranks: int, timeout_s: float, version: int
                ) -> relay_pb2.VllmNcclTicket:
    """Open the rendezvous for one NCCL transfer of `pairs` to a worker of `ranks` ranks
    and send on a thread of its own; the ticket tells the worker where to meet (`host`, the
    address it dials; the store listens on `bind`)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((bind, 0))
    listener.listen()
    port = listener.getsockname()[1]
    world = 1 + ranks
    threading.Thread(target=_send_nccl, name=f"vllm-nccl-v{version}", daemon=True,
                     args=(pairs, device, bind, port, listener, world, timeout_s, version)
                     ).start()
    return relay_pb2.VllmNcclTicket(master_address=host, master_port=port, world_size=world,
                                    packed_buffer_size_bytes=PACKED_BUFFER_BYTES,
                                    packed_num_buffers=PACKED_BUFFERS, timeout_s=timeout_s)


def _send_nccl(pairs, device, bind, port, listener, world, timeout_s, version) -> None:
    """Rank 0 of the transfer group: meet the worker's ranks, broadcast `pairs` packed, as
    vLLM's NCCL trainer engine does, then tear the group down. A worker that never comes is
    given up on at the store's deadline; the communicator is aborted `timeout_s` after it is
    made, however far the send got. Only the send itself, which holds the packed buffers,
    waits its turn: a worker that met the relay and died cannot keep the others waiting."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.utils import StatelessProcessGroup
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

    comm, watchdog, turn = None, None, False
    ended = threading.Lock()  # the watchdog's abort and the end's: one, once

    def end() -> None:
        if ended.acquire(blocking=False) and comm is not None:
            comm.destroy()

    try:
        torch.cuda.set_device(device)
        group = StatelessProcessGroup.create(bind, port, 0, world, listen_socket=listener,
                                             store_timeout=int(timeout_s))
        comm = PyNcclCommunicator(group, device=device)
        # every rank has joined once the communicator exists: the store (vLLM's TCPStore,
        # through which it sends pickled objects) stops listening now, not when the send ends
        comm.group = group = None
        watchdog = threading.Timer(timeout_s, end)
        watchdog.daemon = True
        watchdog.start()
        turn = _SENDING.acquire(timeout=timeout_s)
        if not turn:
            raise TimeoutError(f"no turn to send within {timeout_s:.0f} s")
        engine = NCCLTrainerWeightTransferEngine(
            client=WorkerDriven(), source=source(pairs), is_sender=True, packed=True,
            packed_buffer_size_bytes=PACKED_BUFFER_BYTES, packed_num_buffers=PACKED_BUFFERS)
        engine.model_update_group = comm
        engine.send_weights()
    except Exception as err:  # the worker gave up or died; it will pull again
        log.warning("vLLM NCCL send of version %d failed: %s", version, err)
    finally:
        if watchdog is not None:
            watchdog.cancel()
        end()
        if turn:
            _SENDING.release()


def ipc_shares(pairs: list[tuple[str, torch.Tensor]]) -> tuple[str, list[relay_pb2.CudaIpcShare]]:
    """(the GPU's UUID, a CUDA IPC share of each tensor of `pairs`) as torch shares a CUDA
    tensor with another process (torch.multiprocessing.reductions.reduce_tensor): the
    storage's handle and this share's reference counter and event, every field a number or
    bytes, so the worker rebuilds each tensor from fields it knows the types of (nothing is
    unpickled). The tensors must stay alive until the worker is done with them."""
    from torch.multiprocessing.reductions import reduce_tensor

    shares = []
    for _, tensor in pairs:
        _, args = reduce_tensor(tensor)
        # rebuild_cuda_tensor's arguments: (tensor class, size, stride, offset, storage
        # class, dtype, device, storage handle, storage bytes, storage offset, requires grad,
        # counter handle, counter offset, event handle, event sync required)
        shares.append(relay_pb2.CudaIpcShare(
            storage_handle=args[7], storage_size_bytes=args[8], storage_offset_bytes=args[9],
            ref_counter_handle=args[11], ref_counter_offset=args[12], event_handle=args[13],
            event_sync_required=args[14]))
    return gpu_uuid(pairs[0][1].device), shares


def gpu_uuid(device: torch.device) -> str:
    """The physical identity of `device`, the same in every process whatever its
    CUDA_VISIBLE_DEVICES."""
    return str(torch.cuda.get_device_properties(device).uuid)


class IpcHolds:
    """The GPU copies the relay keeps alive for workers reading them over CUDA IPC, each
    under its pull's id until the worker's ClosePull names it, or until its deadline."""

    def __init__(self):
        self._held: dict[str, tuple[torch.Tensor, threading.Timer]] = {}
        self._lock = threading.Lock()

    def hold(self, flat: torch.Tensor, timeout_s: float) -> str:
        """Keep `flat` alive; the pull's id, for ClosePull."""
        pull_id = secrets.token_hex(8)
        timer = threading.Timer(timeout_s, self.release, args=(pull_id,))
        timer.daemon = True
        with self._lock:
            self._held[pull_id] = (flat, timer)
        timer.start()
        return pull_id

    def release(self, pull_id: str) -> None:
        with self._lock:
            held = self._held.pop(pull_id, None)
        if held is not None:
            held[1].cancel()
            torch.cuda.ipc_collect()  # frees what the worker has let go of

    def close(self) -> None:
        for pull_id in list(self._held):
            self.release(pull_id)


