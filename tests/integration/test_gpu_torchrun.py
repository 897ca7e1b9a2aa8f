"""The trainer under torchrun over NCCL on two GPUs: the ranks (cuda:LOCAL_RANK, as
init_world resolves them) train every scenario to one process's weights and run the service
trainer through a checkpoint and a resume, as test_distributed_trainer.py shows with gloo
on the CPU. Marked `gpu`: skipped, with the reason, on a machine with fewer than two GPUs
(NCCL refuses two ranks on one)."""

import pytest
import torch

from tests.integration.distributed_worker import SCENARIOS, run_scenario
from tests.integration.test_distributed_trainer import (  # noqa: F401  (fixtures)
    assert_same_weights,
    redis_url,
    two_ranks,
)
from trainer_svc.distributed import World

pytestmark = [
    pytest.mark.gpu, pytest.mark.integration,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (NCCL "
                       f"refuses two ranks on one); this machine has "
                       f"{torch.cuda.device_count()}"),
]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_two_nccl_ranks_train_like_one_process(two_ranks, tiny_lm, name):  # noqa: F811
    one = run_scenario(name, str(tiny_lm.path), World())
    assert_same_weights(two_ranks["runs"][name]["weights"], one["weights"])
