"""The trainer's precision policy (`trainer.precision`), resolved once for its device.

Under bf16 only the forward passes run under torch.autocast in bfloat16 (matrix products,
attention); what the optimizer touches stays float32: parameters (the master copy, which is
also what is published and checkpointed), gradients (autocast's backward writes them in the
parameters' dtype) and AdamW's moments. Log-softmax and log-probabilities are computed in
float32 from float32 logits (trainer_svc.batching, trainer_svc.shared_prefix), so losses,
ratios and the engine check compare float32 numbers whatever the passes ran in.

Under torchrun, FSDP2 sharding the modules, bf16 also sets its MixedPrecisionPolicy
(`fsdp_policy`): each unit all-gathers its parameters for a pass in bfloat16, half the bytes
moved and held unsharded, and reduce-scatters their gradients in float32 into the float32
shards, which stay the master copy the optimizer steps. Autocast is kept beside it: the
policy casts parameters at the boundary of each unit, so every op would then run in
bfloat16, while autocast still decides op by op what runs in float32 (softmax and
log-softmax, the norms' reductions, autocast's float32 list) as it does in one process; its
casts of weights that are bfloat16 already cost nothing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from relayrl.config import ConfigError


@dataclass(frozen=True)
class Precision:
    device: torch.device
    autocast_dtype: torch.dtype | None  # None: float32 throughout

    @property
    def name(self) -> str:
        return "fp32" if self.autocast_dtype is None else "bf16"

    def autocast(self):
        """The context a forward pass runs in."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def fsdp_policy(self):
        """FSDP2's mixed precision under this policy: parameters gathered in bfloat16 and
        gradients reduced in float32 under bf16; none (the parameters' own float32) under
        fp32."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.autocast_dtype is None:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=self.autocast_dtype, reduce_dtype=torch.float32)


def resolve_precision(spec: str, device: torch.device) -> Precision:
    """`spec` (trainer.precision: auto, fp32 or bf16) on `device`: auto is bf16 on a GPU that
    supports it, fp32 elsewhere; bf16 where the device has none is a ValueError."""
    if spec not in ("auto", "fp32", "bf16"):
        raise ConfigError(f"trainer.precision: {spec!r} is not one of auto, fp32, bf16")
    bf16_ok = device.type == "cpu" or (device.type == "cuda" and _cuda_bf16(device))
    if spec == "bf16" and not bf16_ok:
        raise ConfigError(f"trainer.precision: bf16 on {device}, which has no bfloat16 support "
                         "(set fp32 or auto)")
    if spec == "bf16" or (spec == "auto" and device.type == "cuda" and bf16_ok):
        return Precision(device, torch.bfloat16)
    return Precision(device, None)


def _cuda_bf16(device: torch.device) -> bool:
    with torch.cuda.device(device):
        return torch.cuda.is_bf16_supported()
