"""A checkpoint is on the disk before it is published: every file and its directory are
fsynced before the rename that makes the step visible, and the rename itself before save
returns (the trainer acknowledges the batches a checkpoint covers right after)."""

import os
from pathlib import Path

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
    assert {Path("model.safetensors"), Path("trainer_state.pt")} <= files
    assert {os.path.join(tmp, f) for f in files} | {tmp} <= synced_before
    assert ("fsync", os.path.realpath(tmp_path)) in events[at + 1:]
    assert checkpoint.latest(tmp_path) == final
