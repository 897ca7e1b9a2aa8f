"""Adapter versions for the vLLM engine: each version the relay ships under trainer.lora
becomes a LoRA adapter that vLLM serves beside its unchanged base weights.

vLLM takes an adapter as a directory in peft's format (adapter_config.json and
adapter_model.safetensors) named by a LoRARequest. A version is written there (under
/dev/shm when the machine has it: a few MB that never touch a disk), added to the engine
(vLLM loads and checks it then, so a bad version fails before any request uses it), made
the one every request runs with, and the version before it removed. Version 0 is the base
model itself (a new adapter's B is 0), so no adapter is used until version 1.

    adapters = AdapterVersions(model_dir, cfg.trainer.lora, dtype)
    request = adapters.write(tensors, version)     # checked against the expected adapter
"""

from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch

from relayrl.config import LoraConfig
from relayrl.weights.tied import check_state_dict

ADAPTER_WEIGHTS = "adapter_model.safetensors"


def expected_adapter(model_dir: Path, cfg: LoraConfig, dtype: torch.dtype
                     ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The adapter's state (names, shapes, dtypes, on the meta device) as the trainer's peft
    model names it, and its peft config as adapter_config.json holds it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from relayrl.models.lora import adapter_state, with_lora

    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir),
                                                dtype=dtype)
        model = with_lora(base, cfg)
    config = model.peft_config["default"].to_dict()
    config["base_model_name_or_path"] = str(model_dir)
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    return dict(adapter_state(model)), config


class AdapterVersions:
    """Adapter directories for vLLM, one per version, the older ones removed."""

    def __init__(self, model_dir: Path, cfg: LoraConfig, dtype: torch.dtype):
        self.expected, self.config = expected_adapter(model_dir, cfg, dtype)
        shm = Path("/dev/shm")
        self.root = Path(tempfile.mkdtemp(prefix="relayrl-lora-",
                                          dir=shm if shm.is_dir() else None))
        # removed by close(), or when the worker exits (it stops without closing its engine):
        # /dev/shm is memory, and outlives the process
        self._remove_root = weakref.finalize(self, shutil.rmtree, self.root, True)
        self.next_id = 1  # vLLM's adapter ids start at 1

    def write(self, tensors: dict[str, torch.Tensor], version: int) -> tuple[str, int, Path]:
        """(name, id, directory) of the version's adapter, written in peft's format;
        ValueError when its names, shapes or dtypes are not the expected adapter's."""
        from safetensors.torch import save_file

        check_state_dict(self.expected, tensors, version)
        path = self.root / f"v{version}-{self.next_id}"
        path.mkdir()
        save_file({k: t.detach().to("cpu").contiguous() for k, t in tensors.items()},
                  str(path / ADAPTER_WEIGHTS))
        (path / "adapter_config.json").write_text(json.dumps(self.config))
        lora_id, self.next_id = self.next_id, self.next_id + 1
        return f"relayrl-v{version}", lora_id, path

    def remove(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        self._remove_root()
