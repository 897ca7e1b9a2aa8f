"""Where a service runs its model: a config's device spec resolved to one torch.device.

Every service that holds a model (the trainer, the torch rollout engine) calls
`resolve_device` once at start-up with its config field, and moves everything there. Specs:

- `auto`: the GPU when CUDA is present (cuda:LOCAL_RANK under torchrun, else cuda:0), else
  the CPU;
- `cpu`;
- `cuda`: like auto, but an error when CUDA is absent;
- `cuda:N`: that GPU, which must exist.

The config models check the spelling at load (DEVICE_PATTERN); what exists is only known on
the machine that runs the service, so that is checked here.
"""

from __future__ import annotations

import os
import re

import torch

from relayrl.config import ConfigError
from relayrl.config.base import DEVICE_HELP, DEVICE_PATTERN


def resolve_device(spec: str, field: str) -> torch.device:
    """The device `spec` names on this machine; ValueError naming `field` (the config
    field it came from) when it is malformed or names a GPU that is not there."""
    match = re.fullmatch(DEVICE_PATTERN, spec)
    if match is None:
        raise ConfigError(f"{field}: {spec!r} is not a device; expected {DEVICE_HELP}")
    if spec == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if spec == "auto":
            return torch.device("cpu")
        raise ConfigError(f"{field}: {spec!r} asks for a GPU, and CUDA is not available on "
                         "this machine (set cpu or auto)")
    count = torch.cuda.device_count()
    if match.group(2):  # cuda:N
        index = int(spec.split(":")[1])
        what = f"{field}: {spec!r} names GPU {index}"
    else:
        index = _local_rank(field)
        what = f"{field}: {spec!r} takes GPU LOCAL_RANK={index}"
    if index >= count:
        raise ConfigError(f"{what}, and this machine has {count} GPU(s), at most "
                         f"cuda:{count - 1}")
    return torch.device("cuda", index)


def _local_rank(field: str) -> int:
    """This process's GPU under torchrun (one process per GPU), else 0."""
    raw = os.environ.get("LOCAL_RANK", "0")
    if not raw.isdigit():
        raise ConfigError(f"{field}: LOCAL_RANK={raw!r} is not a GPU index (torchrun sets it)")
    return int(raw)


def model_device(model) -> torch.device:
    """Where `model`'s weights are: its first parameter's device (the CPU for a module that
    has none, such as a test's wrapper around another model's forward)."""
    param = next(iter(model.parameters()), None)
    return param.device if param is not None else torch.device("cpu")
