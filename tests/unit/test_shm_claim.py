"""relayrl_torch.weights.shm_handoff.claim_file: a spare is reused only when it is a regular file
of ours, anything else under a spare's name keeps that name, and a claim that fails leaves
nothing behind."""

import os

import pytest

from relayrl_torch.weights.shm_handoff import claim_file


def test_a_spare_is_claimed_and_sized(tmp_path):
    spare = tmp_path / "relayrl-1-v0-spare00"
    spare.write_bytes(b"x" * 10)
    inode = spare.stat().st_ino
    fd = claim_file(str(tmp_path / "new"), 4)
    os.close(fd)
    assert not spare.exists()
    assert (tmp_path / "new").stat().st_ino == inode
    assert (tmp_path / "new").stat().st_size == 4


@pytest.mark.parametrize("kind", ["symlink", "directory"])
def test_a_foreign_spare_keeps_its_name(tmp_path, kind):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"not ours")
    spare = tmp_path / "relayrl-1-v0-spare00"
    if kind == "symlink":
        spare.symlink_to(target)
    else:
        spare.mkdir()
    fd = claim_file(str(tmp_path / "new"), 4)
    os.close(fd)
    assert spare.is_symlink() if kind == "symlink" else spare.is_dir()
    assert (tmp_path / "new").is_file() and not (tmp_path / "new").is_symlink()
    assert target.read_bytes() == b"not ours"


@pytest.mark.parametrize("with_spare", [False, True])
def test_a_failed_claim_leaves_nothing(tmp_path, with_spare):
    if with_spare:
        (tmp_path / "relayrl-1-v0-spare00").write_bytes(b"x")
    with pytest.raises(OverflowError):
        claim_file(str(tmp_path / "new"), 2**64)  # no file can be that long
    assert not (tmp_path / "new").exists()
