"""Buffer.Submit's checks on a real Redis: each refusal names the field, the value and the
limit and writes nothing; a repeated request_id appends nothing."""

import json

import msgspec
import pytest

from buffer_svc.submit import MAX_SOURCE_CHARS, StaleGroup, Submissions
from relayrl.config import ModelLimits, PretrainedModel, RunConfig, read_model_limits
from relayrl.contracts.codec import CodecError
from relayrl.contracts.keys import EXTERNAL_PROMPT_BASE, RunKeys
from relayrl.contracts.messages import FinishReason, Sample, decode_group
from relayrl.contracts.proto.v1 import buffer_pb2
from relayrl.contracts.streams import pending_samples
from relayrl.runtime.redis_conn import EmbeddedRedis, connect

MODEL = ModelLimits(vocab_size=15, context_length=16, source="test model")
KEYS = RunKeys("sub")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    yield server
    server.shutdown()


@pytest.fixture
def redis(server):
    r = connect(server.url)
    r.flushall()
    r.set(KEYS.trainer_version, 3)
    return r


def submissions(redis, task=None, **buffer) -> Submissions:
    cfg = RunConfig.model_validate({
        "run_id": "sub", "task": task or {},
        "buffer": {"group_size": 2, "groups_per_batch": 2, "max_pending_samples": 64, **buffer}})
    return Submissions(redis, cfg.buffer_part(), MODEL)


def waiting(redis) -> int:
    """Samples on the trajectory stream."""
    return pending_samples(redis, KEYS, 2)


def trajectory(**kw):
    base = dict(prompt_tokens=[1, 5], response_tokens=[6, 7, 8], logprobs=[-0.1, 0, -0.3],
                versions=[2, 2, 3], loss_mask=[1, 0, 1], reward=0.5, finish_reason="stop")
    base.update(kw)
    return buffer_pb2.Trajectory(**base)


def group(*trajs, **kw):
    return buffer_pb2.SubmitRequest(trajectories=list(trajs) or [trajectory(), trajectory()],
                                    **kw)


def test_submit_writes_a_whole_group_under_an_external_id(redis):
    subs = submissions(redis)
    pid, repeated = subs.submit(group(source="agent"))
    assert pid > EXTERNAL_PROMPT_BASE and not repeated
    (_, entry), = redis.xrange(KEYS.trajectories)  # one entry: the whole group
    g = decode_group(entry[b"data"])
    samples = g.samples
    assert g.prompt_id == pid and [s.prompt_id for s in samples] == [pid, pid]
    assert [s.lease_id for s in samples] == [f"external:{pid}"] * 2
    assert samples[0].loss_mask.tolist() == [1, 0, 1] and samples[0].oldest_version == 2


@pytest.mark.parametrize("trajs,message", [
    ([trajectory()], "SubmitRequest.trajectories: 1 given, a group is buffer.group_size (2)"),
    ([trajectory(), trajectory(response_tokens=[6, 7, 1000])],
     "trajectories[1].response_tokens[2]: token id 1000 is outside the model's vocabulary "
     "[0, 15) (test model)"),
    ([trajectory(prompt_tokens=[1, 15]), trajectory()],
     "trajectories[0].prompt_tokens[1]: token id 15 is outside the model's vocabulary"),
    ([trajectory(prompt_tokens=[-1, 5]), trajectory()],
     "trajectories[0].prompt_tokens[0]: -1 is below 0"),
    ([trajectory(prompt_tokens=[1] * 14), trajectory()],
     "trajectories[0]: prompt_tokens (14) + response_tokens (3) = 17 tokens, over the "
     "model's context length 16 (test model)"),
    ([trajectory(), trajectory(reward=3e38)],
     "trajectories[1].reward: 3e+38 is outside task.reward_range [0, 1]"),
    ([trajectory(), trajectory(reward=1e4)],
     "trajectories[1].reward: 10000.0 is outside task.reward_range [0, 1]"),
    ([trajectory(reward=-0.5), trajectory()],
     "trajectories[0].reward: -0.5 is outside task.reward_range [0, 1]"),
    ([trajectory(), trajectory(reward=float("nan"))], "trajectories[1].reward: nan is outside"),
    ([trajectory(reward=float("-inf")), trajectory()], "trajectories[0].reward: -inf is outside"),
    ([trajectory(), trajectory(versions=[2, 2, 9])],
     "trajectories[1].versions[2]: version 9 is newer than the latest policy version (3)"),
    ([trajectory(versions=[2, -1, 3]), trajectory()],
     "trajectories[0].versions[1]: -1 is below 0"),
    ([trajectory(), trajectory(logprobs=[-1.0])], "trajectories[1].logprobs: 1 values for 3"),
    ([trajectory(logprobs=[-0.1, 0, 0.5]), trajectory()],
     "trajectories[0].logprobs[2]: 0.5 is not a finite log-probability <= 0"),
    ([trajectory(logprobs=[-0.1, float("nan"), -0.3]), trajectory()],
     "trajectories[0].logprobs[1]: nan is not a finite log-probability"),
    ([trajectory(loss_mask=[1, 2, 1]), trajectory()],
     "trajectories[0].loss_mask[1]: 2 is outside [0, 2)"),
    ([trajectory(loss_mask=[1, 1, 257]), trajectory()],  # not 1 as a uint8
     "trajectories[0].loss_mask[2]: 257 is outside [0, 2)"),
    ([trajectory(loss_mask=[-1, 1, 1]), trajectory()],
     "trajectories[0].loss_mask[0]: -1 is below 0"),
    ([trajectory(), trajectory(loss_mask=[1, 1])],
     "trajectories[1].loss_mask: 2 values for 3 response tokens"),
    ([trajectory(loss_mask=[0, 0, 0]), trajectory()],
     "trajectories[0].loss_mask: no token is the policy's"),
    ([trajectory(), trajectory(versions=[2, 2])],
     "trajectories[1].versions: 2 values for 3 response tokens"),
    ([trajectory(), trajectory(finish_reason="eos")],
     "trajectories[1].finish_reason: 'eos' is not 'stop' or 'length'"),
    ([trajectory(prompt_tokens=[]), trajectory()],
     "trajectories[0].prompt_tokens: must hold at least one token"),
    ([trajectory(response_tokens=[]), trajectory()],
     "trajectories[0].response_tokens: must hold at least one token"),
])
def test_bad_submissions_are_refused_by_name_and_write_nothing(redis, trajs, message):
    subs = submissions(redis)
    with pytest.raises(CodecError) as info:
        subs.submit(group(*trajs))
    assert message in str(info.value)
    assert waiting(redis) == 0 and redis.get(KEYS.external_ids) is None
    assert subs.refused == 1 and subs.accepted == 0


def test_a_source_over_the_limit_is_refused_naming_its_length(redis):
    subs = submissions(redis)
    for size in (MAX_SOURCE_CHARS + 1, 1 << 20):
        with pytest.raises(CodecError, match=f"SubmitRequest.source: {size} characters, over "
                                             f"the limit of {MAX_SOURCE_CHARS}"):
            subs.submit(group(source="x" * size))
    assert waiting(redis) == 0 and subs.refused == 2
    assert subs.submit(group(source="y" * MAX_SOURCE_CHARS))[0] > EXTERNAL_PROMPT_BASE


def test_a_groups_source_is_stored_once_not_in_every_sample(redis):
    """The source costs a group's entry its own length once, whatever the group's size."""
    subs = submissions(redis)
    source = "agent-" + "z" * (MAX_SOURCE_CHARS - 6)
    subs.submit(group(source=""))
    subs.submit(group(source=source))
    (_, bare), (_, named) = redis.xrange(KEYS.trajectories)
    assert len(named[b"data"]) - len(bare[b"data"]) < 1.1 * len(source)
    assert named[b"data"].count(source.encode()) == 1
    assert decode_group(named[b"data"]).source == source


def test_each_trajectory_field_is_the_sample_field_of_its_name(redis):
    """The Trajectory message is Sample's language-neutral form: every field it carries is
    Sample's field of the same name, and what it leaves empty takes Sample's default."""
    fields = {f.name for f in msgspec.structs.fields(Sample)}
    assert {d.name for d in buffer_pb2.Trajectory.DESCRIPTOR.fields} <= fields
    bare = trajectory(loss_mask=[], finish_reason="")
    pid, _ = submissions(redis).submit(group(bare, trajectory(finish_reason="length")))
    (_, entry), = redis.xrange(KEYS.trajectories)
    first, second = decode_group(entry[b"data"]).samples
    assert first.loss_mask is None and first.finish_reason is FinishReason.STOP
    assert second.finish_reason is FinishReason.LENGTH
    assert first.prompt_tokens.tolist() == [1, 5] and first.response_tokens.tolist() == [6, 7, 8]
    assert first.versions.tolist() == [2, 2, 3] and first.reward == 0.5
    assert first.worker_id == "external"


def test_a_tasks_declared_reward_range_is_the_limit(redis):
    """External rewards are held to the task's scale: [0, 1] as every built-in reward, or
    the range a task declares."""
    assert submissions(redis).submit(group(trajectory(reward=0), trajectory(reward=1)))[0]
    subs = submissions(redis, task={"reward_range": [-2, 5]})
    with pytest.raises(CodecError, match=r"reward: 5.5 is outside task.reward_range \[-2, 5\]"):
        subs.submit(group(trajectory(), trajectory(reward=5.5)))
    assert subs.submit(group(trajectory(reward=-2), trajectory(reward=5)))[0]


def test_a_group_already_past_the_staleness_bound_is_refused(redis):
    """The trainer at version 10 with trainer.max_staleness 4 trains tokens of version 6 and
    up; older ones it would drop unseen, so Submit refuses them, naming all three numbers."""
    redis.set(KEYS.trainer_version, 10)
    subs = submissions(redis)
    with pytest.raises(StaleGroup) as info:
        subs.submit(group(trajectory(versions=[6, 6, 6]), trajectory(versions=[5, 9, 9])))
    assert ("trajectories[1].versions: the group's oldest policy token is of version 5, 5 "
            "behind the trainer's latest version 10, over trainer.max_staleness (4)"
            in str(info.value))
    assert waiting(redis) == 0 and subs.stale == 1
    # a tool's token (loss_mask 0) is not the policy's: its version does not count
    fresh = trajectory(versions=[6, 0, 6])
    assert subs.submit(group(fresh, fresh))[0] > EXTERNAL_PROMPT_BASE


def test_the_live_staleness_bound_is_the_one_applied(redis):
    redis.set(KEYS.trainer_version, 10)
    redis.hset(KEYS.live_settings, "max_staleness", json.dumps(8))  # an operator's change
    old = trajectory(versions=[2, 2, 2])
    assert submissions(redis).submit(group(old, old))[0] > EXTERNAL_PROMPT_BASE


def test_a_repeated_request_id_returns_the_first_prompt_id_and_appends_nothing(redis):
    subs = submissions(redis)
    first = subs.submit(group(request_id="agent-7:group-1"))
    again = subs.submit(group(request_id="agent-7:group-1"))  # the first reply was lost
    assert first == (again[0], False) and again[1]
    assert waiting(redis) == 2 and subs.accepted == 1 and subs.repeated == 1
    assert 0 < redis.ttl(KEYS.submit_request("agent-7:group-1")) <= 3600
    other = subs.submit(group(request_id="agent-7:group-2"))
    assert other[0] == first[0] + 1 and waiting(redis) == 4


def test_a_request_id_reused_for_another_group_is_refused(redis):
    subs = submissions(redis)
    pid, _ = subs.submit(group(request_id="g1"))
    with pytest.raises(CodecError, match=f"request_id: 'g1' was given to a different group "
                                         f"\\(prompt {pid}\\)"):
        subs.submit(group(trajectory(reward=1.0), trajectory(), request_id="g1"))
    with pytest.raises(CodecError, match="request_id: 'a b' is not 1 to 128 of"):
        subs.submit(group(request_id="a b"))
    assert waiting(redis) == 2


def test_a_full_buffer_remembers_no_request_id(redis):
    """Refused for room, the group went nowhere: its retry must be taken, not answered."""
    from relayrl.contracts.streams import BufferFull

    subs = submissions(redis, max_pending_samples=4, groups_per_batch=2)
    subs.submit(group())
    subs.submit(group())
    with pytest.raises(BufferFull):
        subs.submit(group(request_id="later"))
    assert redis.get(KEYS.submit_request("later")) is None
    redis.delete(KEYS.trajectories)
    assert subs.submit(group(request_id="later")) == (EXTERNAL_PROMPT_BASE + 4, False)


def limits(m: ModelLimits) -> tuple[int, int]:
    return m.vocab_size, m.context_length


def test_model_limits_come_from_config_json_or_the_run_config(tmp_path, tiny_lm):
    (tmp_path / "config.json").write_text(json.dumps(
        {"vocab_size": 49152, "max_position_embeddings": 8192}))
    assert limits(read_model_limits(tmp_path)) == (49152, 8192)
    cfg = RunConfig()
    # the tiny model, known before it is built, is the one relayrl_torch.models.tiny builds
    assert limits(cfg.model.limits()) == (15, 256)
    # a pretrained model not yet converted: its known numbers
    assert limits(PretrainedModel(cache_dir=str(tmp_path / "none")).limits()) == (49152, 8192)
    assert limits(read_model_limits(tiny_lm.path)) == (15, 256)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10}))
    with pytest.raises(ValueError, match="gives no positive vocab_size"):
        read_model_limits(tmp_path)
