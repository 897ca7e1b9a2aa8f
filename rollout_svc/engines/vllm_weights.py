"""A vLLM worker's side of vLLM's weight-transfer engines (the `vllm` data plane): a version
goes from the relay's GPU copy straight into vLLM's parameters, with no host copy on the
worker and no second copy of the weights on its GPU.

vLLM is built with `weight_transfer_config` naming one backend, chosen from the plan before
the engine starts (RunConfig.vllm_transfer): `ipc` for a worker on its relay's GPU (CUDA IPC:
vLLM reads the relay's copy in place), else `nccl` (a NCCL group of the relay and the worker's
ranks, a group per pull). A pull is vLLM's own RL sequence, which the worker drives:
`init_weight_transfer_engine`, `start_weight_update`, `update_weights`,
`finish_weight_update`, `shutdown_weight_transfer_engine`; the relay's side is
relay_svc.vllm_planes. The manifest and the version order stay RelayRL's: the worker has the
manifest over gRPC and checks it against its model before anything moves.

Adapter versions (trainer.lora) are not carried: vLLM takes an adapter as files
(`add_lora`), which its weight-transfer engines do not move; the config refuses the plane
for them.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from relayrl.contracts.proto.v1 import relay_pb2
from relayrl_torch.weights import WeightError
from relayrl_torch.weights.layout import shard_offsets
from relayrl_torch.weights.manifest import Manifest, torch_dtype

BACKENDS = ("nccl", "ipc")


def update_info(manifest: Manifest, aliases: dict[str, str]) -> dict[str, list]:
    """vLLM's update info (names, dtype names, shapes) of what the relay sends: every shard in
    manifest order, then each alias (relay_svc.vllm_planes.source_tensors)."""
    by_name = {s.name: s for s in manifest.shards}
    shards = [(s.name, s) for s in manifest.shards] + [
        (alias, by_name[shard]) for alias, shard in aliases.items()]
    return {"names": [n for n, _ in shards], "dtype_names": [s.dtype for _, s in shards],
            "shapes": [list(s.shape) for _, s in shards]}


def nccl_init_info(ticket: relay_pb2.VllmNcclTicket) -> dict[str, Any]:
    """vLLM's NCCLWeightTransferInitInfo for the ticket: the relay is rank 0, the worker's
    ranks follow it."""
    return {"master_address": ticket.master_address, "master_port": int(ticket.master_port),
            "rank_offset": 1, "world_size": int(ticket.world_size), "packed": True,
            "packed_buffer_size_bytes": int(ticket.packed_buffer_size_bytes),
            "packed_num_buffers": int(ticket.packed_num_buffers)}


def ipc_handles(manifest: Manifest, aliases: dict[str, str], ticket: relay_pb2.VllmIpcTicket
                ) -> list[dict[str, tuple]]:
    """vLLM's IPC handles for the ticket, one per name of update_info: the arguments
    torch.multiprocessing's rebuild_cuda_tensor takes, the tensor's shape, stride and offset
    computed here from the manifest's layout and the storage's from the relay's share (its
    numbers and bytes only). vLLM puts its own device in place of the device index."""
    by_name = {s.name: s for s in manifest.shards}
    names = [s.name for s in manifest.shards] + list(aliases.values())
    if len(ticket.shares) != len(names):
        raise WeightError(f"VllmIpcTicket.shares: {len(ticket.shares)}, and {len(names)} "
                          "tensors are sent")
    offsets = shard_offsets(manifest)
    out = []
    for shard, share in zip(names, ticket.shares, strict=True):
        s = by_name[shard]
        dtype = torch_dtype(s.dtype)
        size = torch.Size(s.shape)
        stride = torch.empty(size, device="meta").stride()  # contiguous
        offset = offsets[shard] // dtype.itemsize  # 64-byte aligned: whole elements
        out.append({ticket.gpu_uuid: (
            torch.Tensor, size, stride, offset, torch.UntypedStorage, dtype, 0,
            share.storage_handle, share.storage_size_bytes, share.storage_offset_bytes,
            False, share.ref_counter_handle, share.ref_counter_offset, share.event_handle,
            share.event_sync_required)})
    return out


def open_pull(relay, manifest: Manifest, backend: str, ranks: int, aliases: dict[str, str],
              gpu_uuid: str) -> relay_pb2.PullTicket:
    """A ticket for `manifest`'s version from `relay` (a RelayClient), whose manifest must be
    the one the worker checked: WeightError before anything moves otherwise."""
    assert backend in BACKENDS, backend
    got, ticket = relay.open_vllm(manifest.version, ranks, aliases,
                                  gpu_uuid if backend == "ipc" else "")
    if got.to_proto() != manifest.to_proto():
        if backend == "ipc":
            relay.close_vllm(got.version, ticket.vllm_ipc.pull_id)
        raise WeightError(f"OpenPull: the relay's manifest of version {got.version} is not "
                          f"the one of version {manifest.version} checked")
    return ticket


def requests(manifest: Manifest, ticket: relay_pb2.PullTicket, aliases: dict[str, str]
             ) -> tuple[dict[str, Any], dict[str, Any], float]:
    """(vLLM's init info, its update info, the deadline in seconds) of a ticket; WeightError
    for one that does not fit the manifest, before anything moves."""
    info = update_info(manifest, aliases)
    if ticket.WhichOneof("ticket") == "vllm_ipc":
        info["ipc_handles"] = ipc_handles(manifest, aliases, ticket.vllm_ipc)
        return {"packed": False}, info, ticket.vllm_ipc.timeout_s
    return nccl_init_info(ticket.vllm_nccl), info, ticket.vllm_nccl.timeout_s


def transfer(llm, relay, manifest: Manifest, ticket: relay_pb2.PullTicket,
             asked: tuple[dict[str, Any], dict[str, Any], float]) -> None:
    """Receive the version into `llm` as vLLM's RL sequence does, with `asked` (requests).
    A transfer still running at the ticket's deadline is aborted; one that fails part way
    leaves vLLM's layers unusable, as any reload that fails part way."""
    init, info, timeout_s = asked
    ipc = ticket.WhichOneof("ticket") == "vllm_ipc"
    watchdog = threading.Timer(timeout_s, _abort, args=(llm,))
    watchdog.daemon = True
    watchdog.start()
    try:
        llm.init_weight_transfer_engine({"init_info": init})
        llm.start_weight_update()
        llm.update_weights({"update_info": info})
        llm.finish_weight_update()
    finally:
        watchdog.cancel()
        llm.shutdown_weight_transfer_engine()
        if ipc:
            relay.close_vllm(manifest.version, ticket.vllm_ipc.pull_id)


def _abort(llm) -> None:
    """Past the deadline: abort the worker's end of the transfer, so the call waiting in it
    returns with an error rather than never."""
    llm.collective_rpc(_abort_on_worker)


def _abort_on_worker(worker) -> None:
    """Runs on the vLLM worker: abort the weight-transfer engine's NCCL communicator."""
    group = getattr(worker.weight_transfer_engine, "model_update_group", None)
    if group is not None:
        group.destroy()
