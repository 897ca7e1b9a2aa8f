"""A batch append the Redis client repeats (its connection failed after Redis ran it: a
server killed before replying) must not put the batch on the stream twice, where the
trainer would train it twice."""

import pytest

from buffer_svc.assembler import ReadyBatch
from buffer_svc.server import BufferService
from relayrl.config import RunConfig
from relayrl.contracts import ledger
from relayrl.contracts.keys import BUFFER_GROUP, RunKeys
from relayrl.contracts.messages import Batch, Group, Sample
from relayrl.contracts.streams import TrajectoryWriter, read_group
from relayrl.runtime.redis_conn import connect
from relayrl_ops.redis_server import RedisServer

CFG = RunConfig.model_validate({"run_id": "replay", "buffer": {"group_size": 1,
                                                                "groups_per_batch": 2},
                                "rollout": {}})


@pytest.fixture
def redis(tmp_path):
    server = RedisServer(tmp_path, die_with_launcher=False)
    server.start()
    yield connect(server.url)
    server.shutdown()


def sample(prompt_id: int) -> Sample:
    return Sample(prompt_id=prompt_id, lease_id=f"L{prompt_id}", worker_id="w",
                  prompt_tokens=[1, 2], response_tokens=[3], logprobs=[-0.5], versions=[0],
                  reward=1.0, finish_reason="stop")


def test_a_repeated_batch_append_appends_once_and_still_acknowledges(redis):
    keys = RunKeys(CFG.run_id)
    svc = BufferService(CFG.buffer_part(), redis)
    writer = TrajectoryWriter(redis, keys, 100)
    for pid in (0, 1):
        writer.append(Group(pid, [sample(pid)]))
    entries = read_group(redis, keys.trajectories, BUFFER_GROUP, "buffer-0", count=10,
                         block_ms=10)
    ready = ReadyBatch(Batch("b1", [Group(0, [sample(0)]), Group(1, [sample(1)])]),
                       [e for e, _ in entries])
    svc._emit(ready)
    svc._emit(ready)  # as the client's retry would, after the first ran
    assert redis.xlen(keys.batches) == 1
    assert ledger.members(redis, keys, "batched") == {0, 1}
    assert redis.xlen(keys.trajectories) == 0
    assert redis.xpending(keys.trajectories, BUFFER_GROUP)["pending"] == 0
