"""LoRA adapters through peft, as the trainer trains one and the engines apply its versions.

    model = with_lora(model, cfg.trainer.lora)    # the base frozen, an adapter on each target
    tensors = adapter_state(model)                # what a version ships: the adapter alone
    load_adapter(model, tensors, version)         # an engine takes a version in place
    merged_from(base, checkpoint_dir)             # a checkpoint's adapter merged: an export

Both sides wrap the same base model with the same settings, so the adapter's tensor names
(peft's, without the adapter's own name) match on each side. A new adapter starts with B = 0:
the wrapped model computes exactly what the base model does, which is version 0 everywhere.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import torch

from relayrl.config import ConfigError, LoraConfig
from relayrl_torch.weights.tied import check_state_dict


def _peft():
    try:
        import peft
    except ImportError as err:
        raise ConfigError(f"trainer.lora needs the peft package (pip install peft, or the "
                          f"relayrl[lora] extra): {err}") from None
    return peft


def with_lora(model: torch.nn.Module, cfg: LoraConfig) -> Any:
    """`model` wrapped by peft with a fresh adapter: only the adapter's parameters train."""
    peft = _peft()
    config = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                             target_modules=cfg.target_modules, task_type="CAUSAL_LM")
    try:
        return peft.get_peft_model(model, config)
    except ValueError as err:  # e.g. a target module the model does not have
        raise ConfigError(f"trainer.lora.target_modules {cfg.target_modules!r}: {err}") from None


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The adapter's tensors by peft's names (the live ones: a publisher copies them)."""
    return _peft().get_peft_model_state_dict(model)


_LIVE: weakref.WeakKeyDictionary[Any, dict[str, torch.Tensor]] = weakref.WeakKeyDictionary()


def load_adapter(model: Any, tensors: dict[str, torch.Tensor], version: int) -> None:
    """A published adapter version into `model`, copied into its adapter's tensors in place;
    ValueError when its names, shapes or dtypes differ from the model's adapter."""
    live = _LIVE.get(model)
    if live is None:  # views of the parameters themselves, by peft's names; found once
        live = _LIVE[model] = adapter_state(model)
    check_state_dict(live, tensors, version)
    with torch.no_grad():
        for name, tensor in tensors.items():
            live[name].copy_(tensor)


def is_adapter_dir(directory: Path) -> bool:
    """A checkpoint of an adapter run: peft's adapter_config.json and weights, no model."""
    return (directory / "adapter_config.json").is_file()


def merged_from(base: torch.nn.Module, adapter_dir: Path) -> torch.nn.Module:
    """`base` with the adapter saved in `adapter_dir` merged into its weights: a plain
    model, as if trained whole."""
    model = _peft().PeftModel.from_pretrained(base, str(adapter_dir))
    return model.merge_and_unload()
