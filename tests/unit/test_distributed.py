"""The pure parts of trainer_svc.distributed: how a batch's groups split over ranks, what a
loss divides by, and reading torchrun's environment."""

import pytest
import torch

from trainer_svc.distributed import World, init_world, normaliser, shard_rows


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_every_row_goes_to_one_rank_in_whole_contiguous_groups(size):
    group_ids = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
    shares = [shard_rows(group_ids, rank, size) for rank in range(size)]
    assert torch.cat(shares).tolist() == list(range(len(group_ids)))
    owners = {}
    for rank, rows in enumerate(shares):
        for g in group_ids[rows].tolist():
            assert owners.setdefault(g, rank) == rank, "a group split across ranks"
    counts = [len(torch.unique(group_ids[rows])) for rows in shares]
    assert max(counts) - min(counts) <= 1


def test_a_rank_beyond_the_groups_gets_no_rows():
    assert shard_rows(torch.tensor([0, 0, 0]), rank=1, size=2).numel() == 0


def test_token_means_divide_by_tokens_and_sequence_means_by_sequences():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert normaliser("token_mean", mask).item() == 3.0
    assert normaliser("seq_mean_token_mean", mask).item() == 2.0
    assert normaliser("seq_mean_token_sum_norm", mask).item() == 2.0


def test_without_torchrun_the_world_is_one_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_world() == World()


def test_a_world_size_without_the_rest_of_torchrun_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for var in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="RANK.*torchrun"):
        init_world()
