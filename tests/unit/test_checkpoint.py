"""A checkpoint is on the disk before it is published: every file and its directory are
fsynced before the rename that makes the step visible, and the rename itself before save
returns (the trainer acknowledges the batches a checkpoint covers right after). Its trainer
state reads back exactly and through no pickle, and a pickled one is refused unread."""

import copy
import json
import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer_svc import checkpoint
from trainer_svc.learner import TrainingState


def test_a_checkpoint_reaches_the_disk_before_it_is_published(tiny_lm, tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, Path.rename

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(self: Path, target: Path) -> Path:
        events.append(("rename", os.path.realpath(self)))
        return real_rename(self, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Path, "rename", rename)
    weights = {k: v.clone() for k, v in tiny_lm.model.state_dict().items()}
    state = TrainingState(weights, {}, {"state": {}, "param_groups": []}, False)
    final = checkpoint.save(tmp_path, 3, tiny_lm.model, state, checkpoint.Ledger(),
                            {"totals": {}}, keep=2)

    renames = [i for i, (kind, _) in enumerate(events) if kind == "rename"]
    assert len(renames) == 1
    at, tmp = renames[0], events[renames[0]][1]
    synced_before = {path for kind, path in events[:at] if kind == "fsync"}
    files = {p.relative_to(final) for p in final.rglob("*") if p.is_file()}
    assert {Path("model.safetensors"), Path(checkpoint.STATE_JSON),
            Path(checkpoint.STATE_TENSORS)} <= files
    assert {os.path.join(tmp, f) for f in files} | {tmp} <= synced_before
    assert ("fsync", os.path.realpath(tmp_path)) in events[at + 1:]
    assert checkpoint.latest(tmp_path) == final


class _Planted:
    """A pickle that, unpickled, writes a file: code run by reading a checkpoint."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.write_text, (self.marker, "ran")


def _save(directory: Path, step: int, model, optimizer: dict, objective: dict | None = None,
          ledger: checkpoint.Ledger | None = None) -> Path:
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    state = TrainingState(weights, objective or {}, optimizer, False)
    return checkpoint.save(directory, step, model, state, ledger or checkpoint.Ledger(),
                           {"totals": {"steps": step}, "objective": objective or {}}, keep=3)


def test_a_pickled_state_in_the_newest_checkpoint_is_refused_and_never_run(tiny_lm, tmp_path):
    _save(tmp_path, 1, tiny_lm.model, {"state": {}, "param_groups": []})
    planted = tmp_path / "step_00000009"
    planted.mkdir()
    marker = tmp_path / "marker"
    torch.save(_Planted(marker), planted / checkpoint.PICKLED_STATE)

    assert checkpoint.latest(tmp_path) == planted  # not silently an older step
    with pytest.raises(ValueError, match="trainer_state.pt, a pickle"):
        checkpoint.load_state(checkpoint.latest(tmp_path))
    assert not marker.exists()


def _same(a, b, at: str = "") -> None:
    assert type(a) is type(b), (at, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), at
    elif isinstance(a, dict):
        assert list(a) == list(b), at
        for k in a:
            _same(a[k], b[k], f"{at}/{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), at
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{at}/{i}")
    else:
        assert a == b, at


def _refuse_pickle(monkeypatch) -> None:
    def refused(*args, **kwargs):
        raise AssertionError("a checkpoint was read through pickle")

    for module, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"),
                         (torch, "load")):
        monkeypatch.setattr(module, name, refused)


@pytest.mark.parametrize("kind", ["adamw", "adafactor"])
def test_the_trainer_state_reads_back_exactly_without_pickle(tiny_lm, tmp_path, monkeypatch,
                                                              kind):
    """Optimizer state (moments, step counts, hyperparameter tuples, groups), a value head,
    the ledger and every RNG come back as they were written, types and bits alike."""
    model = copy.deepcopy(tiny_lm.model)
    params = list(model.parameters())
    optimizer = (torch.optim.AdamW(params, lr=1e-2, betas=(0.8, 0.99), fused=True)
                 if kind == "adamw" else torch.optim.Adafactor(params, lr=1e-2, foreach=False))
    sum((p.float() ** 2).sum() for p in params).backward()
    optimizer.step()
    objective = {"value_head": {"weight": torch.randn(1, 32), "bias": torch.zeros(1)}}
    ledger = checkpoint.Ledger([b"1700000000000-0", b"1700000000001-3"], [4, 5], [6])
    final = _save(tmp_path, 7, model, optimizer.state_dict(), objective, ledger)
    draws = torch.rand(3), np.random.rand(3), random.random()

    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    _refuse_pickle(monkeypatch)
    state = checkpoint.load_state(final)
    assert torch.equal(torch.rand(3), draws[0]) and (np.random.rand(3) == draws[1]).all()
    assert random.random() == draws[2]
    assert state["step"] == 7 and state["ledger"] == ledger and not state["optimizer_by_name"]
    _same(state["optimizer"], optimizer.state_dict())
    _same(state["extra"], {"totals": {"steps": 7}, "objective": objective})
    optimizer.load_state_dict(state["optimizer"])  # what the trainer's restore does


def test_a_state_file_naming_a_missing_tensor_is_refused_by_place(tiny_lm, tmp_path):
    final = _save(tmp_path, 1, tiny_lm.model, {"state": {}, "param_groups": []})
    path = final / checkpoint.STATE_JSON
    document = json.loads(path.read_text())
    document["rng"]["torch"] = {"$tensor": "elsewhere"}
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match="rng/torch names tensor 'elsewhere'"):
        checkpoint.load_state(final)
