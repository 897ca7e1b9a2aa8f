"""Durable trainer state: model, optimizer, RNG, step, and the stream positions it covers.

A checkpoint is a directory step_NNNNNNNN: the model as a Hugging Face directory (or a LoRA
adapter as peft writes one), and the trainer's state in two files that name no code:
trainer_state.safetensors holds its tensors (optimizer moments, the torch RNG state, a value
head) and trainer_state.json everything else (step, ledger, totals, optimizer
hyperparameters, the numpy and Python RNG states), each tensor in it a reference into the
safetensors file (trainer_svc.tensor_tree). Reading one unpickles nothing, so a checkpoint
directory can never run code in the trainer. A step directory holding only a pickled
trainer_state.pt, as RelayRL wrote them before, is refused by name.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from trainer_svc import tensor_tree
from trainer_svc.finite import check_finite
from trainer_svc.learner import TrainingState

STATE_JSON = "trainer_state.json"
STATE_TENSORS = "trainer_state.safetensors"
PICKLED_STATE = "trainer_state.pt"  # the format before: refused, never read


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
    _write_state(tmp, {
        "step": step,
        "optimizer": state.optimizer,
        "optimizer_by_name": state.optimizer_by_name,
        "rng": _rng_state(),
        "ledger": {"entry_ids": [e.decode("ascii") for e in ledger.entry_ids],
                   "consumed": ledger.consumed, "dropped": ledger.dropped},
        "extra": extra,
    })
    _sync_tree(tmp)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    _sync(ckpt_dir)  # the rename too, before the caller acknowledges what this covers
    for old in sorted(ckpt_dir.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write_state(directory: Path, state: dict[str, Any]) -> None:
    document, tensors = tensor_tree.split(state)
    save_file(tensors, directory / STATE_TENSORS)
    (directory / STATE_JSON).write_text(json.dumps(document))


def _rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": [name, keys.tolist(), pos, has_gauss, cached_gaussian],
            "python": [version, list(internal), gauss_next]}


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
    """The newest step directory with a trainer state, in either format (load_state refuses
    the pickled one: resuming from an older step instead would repeat finished work)."""
    done = sorted(p for p in ckpt_dir.glob("step_*")
                  if (p / STATE_JSON).is_file() or (p / PICKLED_STATE).is_file())
    return done[-1] if done else None


def load_weights(path: Path, adapter: bool) -> dict[str, torch.Tensor]:
    """A checkpoint's model tensors: the whole model's, or with trainer.lora its adapter's
    (peft's adapter_model.safetensors, by the names relayrl_torch.models.lora uses)."""
    if adapter:
        return load_file(path / "adapter_model.safetensors")
    from transformers import AutoModelForCausalLM

    # safetensors only: the other formats from_pretrained reads are pickles
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                use_safetensors=True).state_dict()


def load_state(path: Path) -> dict[str, Any]:
    """The trainer state `save` wrote in `path`, its ledger a Ledger; the RNGs are set to it.
    ValueError for a directory with a pickled state or a state that is not save's."""
    if not (path / STATE_JSON).is_file():
        raise ValueError(
            f"{path}: the trainer state is {PICKLED_STATE}, a pickle, which the trainer does "
            f"not load (it could run any code); this RelayRL writes {STATE_JSON} and "
            f"{STATE_TENSORS}. Start a new run_dir; to keep its weights, `relayrl export CONFIG "
            f"--checkpoint {path} --out DIR` and start from model.path DIR (a fresh "
            "optimizer)")
    source = str(path / STATE_JSON)
    try:
        document = json.loads((path / STATE_JSON).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{source}: not JSON ({e})") from e
    state = tensor_tree.join(document, load_file(path / STATE_TENSORS), source)
    missing = {"step", "optimizer", "rng", "ledger", "extra"} - set(
        state if isinstance(state, dict) else ())
    if missing:
        raise ValueError(f"{source}: lacks {sorted(missing)}")
    _set_rng_state(state["rng"], source)
    state["ledger"] = _ledger(state["ledger"], source)
    return state


def _set_rng_state(rng: dict[str, Any], source: str) -> None:
    try:
        name, keys, pos, has_gauss, cached_gaussian = rng["numpy"]
        version, internal, gauss_next = rng["python"]
        torch.set_rng_state(rng["torch"])
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss,
                             cached_gaussian))
        random.setstate((version, tuple(internal), gauss_next))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{source}: rng is not an RNG state save writes ({e})") from e


def _ledger(ledger: dict[str, Any], source: str) -> Ledger:
    try:
        return Ledger([e.encode("ascii") for e in ledger["entry_ids"]],
                      [int(p) for p in ledger["consumed"]], [int(p) for p in ledger["dropped"]])
    except (KeyError, TypeError, AttributeError, UnicodeEncodeError) as e:
        raise ValueError(f"{source}: ledger is not a ledger save writes ({e})") from e
