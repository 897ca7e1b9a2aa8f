"""Durable trainer state: model, optimizer, RNG, step, and the stream positions it covers."""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer_svc.finite import check_finite
from trainer_svc.learner import TrainingState


@dataclass
class Ledger:
    """What the steps since the last checkpoint consumed, acknowledged once it is durable."""

    entry_ids: list[bytes] = field(default_factory=list)
    consumed: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)


def save(ckpt_dir: Path, step: int, model, state: TrainingState, ledger: Ledger,
         extra: dict[str, Any], keep: int) -> Path:
    """`model` gives the directory its config; `state` holds the whole weights (or a LoRA
    adapter, written as peft writes one), which must be finite (NonFiniteError before
    anything is written: the last checkpoint stays)."""
    check_finite(state.model, f"write the checkpoint of step {step}")
    for name, module_state in state.objective.items():
        check_finite(module_state, f"write the checkpoint of step {step} ({name})")
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step:08d}"
    tmp = ckpt_dir / f".tmp_step_{step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, state_dict=state.model)  # a loadable Hugging Face directory
    trainer_state = {
        "step": step,
        "optimizer": state.optimizer,
        "optimizer_by_name": state.optimizer_by_name,
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                "python": random.getstate()},
        "ledger": ledger,
        "extra": extra,
    }
    torch.save(trainer_state, tmp / "trainer_state.pt")
    _sync_tree(tmp)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    _sync(ckpt_dir)  # the rename too, before the caller acknowledges what this covers
    for old in sorted(ckpt_dir.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_tree(directory: Path) -> None:
    """Every file, then the directory: the rename publishes the checkpoint, and a crash after
    it must not leave a complete-looking step whose weights never reached the disk."""
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            _sync(path)
    _sync(directory)


def latest(ckpt_dir: Path) -> Path | None:
    done = sorted(p for p in ckpt_dir.glob("step_*") if (p / "trainer_state.pt").is_file())
    return done[-1] if done else None


def load_weights(path: Path, adapter: bool) -> dict[str, torch.Tensor]:
    """A checkpoint's model tensors: the whole model's, or with trainer.lora its adapter's
    (peft's adapter_model.safetensors, by the names relayrl_torch.models.lora uses)."""
    if adapter:
        from safetensors.torch import load_file

        return load_file(path / "adapter_model.safetensors")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()


def load_state(path: Path) -> dict[str, Any]:
    state = torch.load(path / "trainer_state.pt", weights_only=False)
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    return state
