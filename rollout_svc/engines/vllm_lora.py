"""Adapter versions for the vLLM engine, served one of two ways (rollout.engine.lora_serving).

adapter: each version the relay ships under trainer.lora becomes a LoRA adapter that vLLM
serves beside its unchanged base weights. vLLM takes an adapter as a directory in peft's
format (adapter_config.json and adapter_model.safetensors) named by a LoRARequest. A version
is written there (under /dev/shm when the machine has it: a few MB that never touch a disk),
added to the engine (vLLM loads and checks it then, so a bad version fails before any
request uses it), made the one every request runs with, and the version before it removed.
Version 0 is the base model itself (a new adapter's B is 0), so no adapter is used until
version 1.

    adapters = AdapterVersions(model_dir, lora, dtype)  # lora: trainer.lora
    request = adapters.write(tensors, version)     # checked against the expected adapter

merged: each version is added into the base weights, W + (alpha / rank) B A for every
adapted layer, the base read afresh from the model directory each time (so versions never
add up rounding), and the whole model reloaded as a full version is. A version costs one
whole-weight copy instead of a few MB, and decoding runs at the base model's speed: vLLM's
LoRA layers add two small matmuls and a gather per adapted layer per token, which on CPU cut
its sampling rate by about a third (docs/guides/models.md, LoRA).

    merger = MergedVersions(model_dir, lora, dtype)    # lora: trainer.lora
    state = merger.merged(tensors, version)        # a full state dict, the base's names
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
from relayrl_torch.weights.tied import check_state_dict

ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # what peft puts before the base model's own names


def expected_adapter(model_dir: Path, cfg: LoraConfig, dtype: torch.dtype
                     ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The adapter's state (names, shapes, dtypes, on the meta device) as the trainer's peft
    model names it, and its peft config as adapter_config.json holds it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from relayrl_torch.models.lora import adapter_state, with_lora

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


class MergedVersions:
    """Adapter versions merged into the base weights, read from the model directory."""

    def __init__(self, model_dir: Path, cfg: LoraConfig, dtype: torch.dtype):
        self.expected, config = expected_adapter(model_dir, cfg, dtype)
        # trainer.lora makes plain adapters only: the update is (alpha / rank) B A
        assert not (config.get("use_rslora") or config.get("use_dora")
                    or config.get("fan_in_fan_out")), config
        self.scale = cfg.alpha / cfg.rank
        self.dtype = dtype
        self.files = sorted(Path(model_dir).glob("*.safetensors"))
        if not self.files:
            raise ValueError(f"rollout.engine.lora_serving merged: {model_dir} holds no "
                             "*.safetensors to read the base weights from; use lora_serving "
                             "adapter")
        # each adapted weight's base name: its (A, B) names
        self.targets = {
            a.removeprefix(PEFT_PREFIX).removesuffix(".lora_A.weight") + ".weight":
                (a, a.replace(".lora_A.", ".lora_B."))
            for a in self.expected if a.endswith(".lora_A.weight")}

    def merged(self, tensors: dict[str, torch.Tensor], version: int
               ) -> dict[str, torch.Tensor]:
        """The base weights with the version's adapter added, by the base's own names;
        ValueError when its names, shapes or dtypes are not the expected adapter's."""
        from safetensors import safe_open

        check_state_dict(self.expected, tensors, version)
        state, found = {}, set()
        for file in self.files:
            with safe_open(str(file), "pt") as shard:
                for name in shard.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    weight = shard.get_tensor(name)
                    if name in self.targets:
                        a, b = self.targets[name]
                        weight = torch.addmm(weight.float(), tensors[b].float(),
                                             tensors[a].float(), alpha=self.scale)
                        found.add(name)
                    state[name] = weight.to(self.dtype)
        if missing := set(self.targets) - found:
            raise ValueError(f"version {version}: the base weights hold no "
                             f"{sorted(missing)[:3]} to add the adapter to")
        return state
