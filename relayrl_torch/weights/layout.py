"""The flat layout of a version: every shard packed in manifest order into one buffer, each
starting on a 64-byte boundary. Every data plane moves this one buffer, so a transfer is a
single contiguous copy and both ends derive the offsets from the manifest alone."""

from __future__ import annotations

import torch

from relayrl_torch.weights.manifest import Manifest, WeightError, torch_dtype, verify_shard

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def shard_offsets(manifest: Manifest) -> dict[str, int]:
    offsets, pos = {}, 0
    for s in manifest.shards:
        offsets[s.name] = pos
        pos = _align(pos + s.nbytes)
    return offsets


def flat_size(manifest: Manifest) -> int:
    if not manifest.shards:
        return 0
    last = manifest.shards[-1]
    return shard_offsets(manifest)[last.name] + last.nbytes


def pack(manifest: Manifest, tensors: dict[str, torch.Tensor], out: torch.Tensor) -> None:
    """Copy `tensors` into the uint8 buffer `out` at their layout offsets."""
    assert out.dtype == torch.uint8 and out.numel() >= flat_size(manifest)
    for s, off in zip(manifest.shards, shard_offsets(manifest).values(), strict=True):
        t = tensors[s.name].detach().contiguous().view(-1).view(torch.uint8)
        out[off:off + s.nbytes].copy_(t)


def unpack(manifest: Manifest, flat: torch.Tensor, host: torch.Tensor | None = None
           ) -> dict[str, torch.Tensor]:
    """Verified tensors viewing `flat` (no copy), on its device: every shard's length and
    checksum must match the manifest, or WeightError names the shard. `host`: a uint8 host
    buffer to check a GPU `flat` in (a caller's reused staging), else a fresh one."""
    size = flat_size(manifest)
    if flat.numel() < size:
        raise WeightError(f"version {manifest.version}: got {flat.numel()} bytes, "
                          f"its layout needs {size}")
    # xxh3 reads host bytes: a GPU buffer (the nccl plane) costs one device-to-host copy of
    # the whole version (PCIe, some 20-40 ms a GB, and that much host memory) so that a
    # corrupt or mismatched version never reaches the engine
    if flat.device.type == "cpu":
        arr = flat.numpy()
    elif host is not None and host.numel() >= size:
        arr = host[:size].copy_(flat[:size]).numpy()
    else:
        arr = flat[:size].cpu().numpy()
    offsets = shard_offsets(manifest)
    for s in manifest.shards:
        verify_shard(s, memoryview(arr[offsets[s.name]:offsets[s.name] + s.nbytes]))
    return views(manifest, flat)


def views(manifest: Manifest, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each shard's tensor viewing its slice of `flat` (no copy, nothing checked)."""
    offsets = shard_offsets(manifest)
    # the offsets are 64-byte aligned, so every dtype may view its slice
    return {s.name: flat[offsets[s.name]:offsets[s.name] + s.nbytes].view(
        torch_dtype(s.dtype)).view(s.shape) for s in manifest.shards}
