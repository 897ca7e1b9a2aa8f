"""Custom rollouts on a real engine: the gRPC Generate API (unary and streaming), the
OpenAI-compatible HTTP API through the official `openai` client, and the buffer's Submit
API, each refusing bad input by name."""

import grpc
import numpy as np
import openai
import pytest
import torch

from buffer_svc.submit import Submissions
from relayrl import auth
from relayrl.codec import CodecError
from relayrl.config import RolloutConfig
from relayrl.grpc_util import channel, make_server
from relayrl.keys import EXTERNAL_PROMPT_BASE, RunKeys
from relayrl.messages import decode_sample
from relayrl.proto.v1 import buffer_pb2, rollout_pb2, rollout_pb2_grpc
from relayrl.redis_conn import EmbeddedRedis, connect
from rollout_svc.custom import CustomGenerator
from rollout_svc.openai_api import OpenAIServer
from rollout_svc.server import RolloutServicer
from rollout_svc.torch_engine import TorchEngine
from tests.conftest import free_ports

MODEL = "test-policy"


class NoWorker:
    """Generate needs no rollout loop; Status is not exercised here."""


@pytest.fixture(scope="module")
def generator(tiny_lm):
    return CustomGenerator(TorchEngine(tiny_lm, seed=0, version=7), tiny_lm,
                           RolloutConfig(max_new_tokens=5, temperature=1.0))


@pytest.fixture(scope="module")
def grpc_stub(generator):
    (port,) = free_ports(1)
    server, _ = make_server(f"127.0.0.1:{port}", [(
        rollout_pb2_grpc.add_RolloutServicer_to_server, RolloutServicer(NoWorker(), generator))])
    server.start()
    yield rollout_pb2_grpc.RolloutStub(channel(f"127.0.0.1:{port}"))
    server.stop(0)


@pytest.fixture(scope="module")
def http(generator):
    (port,) = free_ports(1)
    server = OpenAIServer(generator, "127.0.0.1", port, MODEL, stream_chunk_tokens=2)
    server.start()
    token = auth.current().token or "unused"  # the server requires the process's, if any
    yield openai.OpenAI(base_url=f"{server.address}/v1", api_key=token, max_retries=0)
    server.stop()


def recompute(lm, prompt, tokens, temperature=1.0):
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0, len(prompt) - 1:-1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def test_generate_returns_tokens_logprobs_and_the_version(grpc_stub, tiny_lm):
    resp = grpc_stub.Generate(rollout_pb2.GenerateRequest(text="3+4=", n=3, seed=5), timeout=30)
    assert resp.policy_version == 7 and len(resp.sequences) == 3
    assert list(resp.prompt_token_ids) == tiny_lm.encode_prompt("3+4=")
    for s in resp.sequences:
        assert 1 <= len(s.token_ids) <= 5 and list(s.versions) == [7] * len(s.token_ids)
        assert s.finish_reason in ("stop", "length")
        expected = recompute(tiny_lm, list(resp.prompt_token_ids), list(s.token_ids))
        assert np.allclose(s.logprobs, expected.numpy(), atol=1e-4)


def test_stream_arrives_in_chunks_that_add_up(grpc_stub):
    req = rollout_pb2.GenerateRequest(token_ids=[1, 5, 6], n=2, chunk_tokens=2,
                                      temperature=3.0, seed=3)
    chunks = list(grpc_stub.GenerateStream(req, timeout=30))
    assert list(chunks[0].prompt_token_ids) == [1, 5, 6]
    for i in range(2):
        mine = [c for c in chunks if c.index == i]
        assert all(len(c.token_ids) <= 2 and c.policy_version == 7 for c in mine)
        assert [bool(c.finish_reason) for c in mine] == [False] * (len(mine) - 1) + [True]
        assert sum(len(c.token_ids) for c in mine) <= 5


def test_ignore_eos_generates_the_whole_budget(grpc_stub, tiny_lm):
    """Sampled with a high temperature, some of 16 sequences stop early unless told not to;
    with ignore_eos every one runs to max_new_tokens (end-of-sequence tokens included)."""
    req = dict(text="3+4=", n=16, max_new_tokens=5, temperature=5.0, seed=11)
    free = grpc_stub.Generate(rollout_pb2.GenerateRequest(**req), timeout=30)
    assert any(s.finish_reason == "stop" for s in free.sequences)
    forced = grpc_stub.Generate(rollout_pb2.GenerateRequest(**req, ignore_eos=True), timeout=30)
    for s in forced.sequences:
        assert len(s.token_ids) == 5 and s.finish_reason == "length"
    assert any(tiny_lm.eos_id in s.token_ids for s in forced.sequences)
    chunks = list(grpc_stub.GenerateStream(rollout_pb2.GenerateRequest(
        **req, ignore_eos=True, chunk_tokens=2), timeout=30))
    for i in range(16):
        assert sum(len(c.token_ids) for c in chunks if c.index == i) == 5


@pytest.mark.parametrize("req,field", [
    (rollout_pb2.GenerateRequest(), "prompt"),
    (rollout_pb2.GenerateRequest(token_ids=[1, 999]), "token_ids"),
    (rollout_pb2.GenerateRequest(text="1+1=", max_new_tokens=99), "max_new_tokens"),
    (rollout_pb2.GenerateRequest(text="1+1=", n=1000), "GenerateRequest.n"),
])
def test_bad_generate_requests_name_the_field(grpc_stub, req, field):
    with pytest.raises(grpc.RpcError) as info:
        grpc_stub.Generate(req, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in info.value.details()


def test_openai_client_completions_chat_and_models(http, tiny_lm):
    assert [m.id for m in http.models.list().data] == [MODEL]
    done = http.completions.create(model=MODEL, prompt="2+2=", max_tokens=4, n=2, logprobs=0,
                                   seed=1)
    assert done.model_extra["policy_version"] == 7 and len(done.choices) == 2
    prompt = done.model_extra["prompt_token_ids"]
    for c in done.choices:
        ids = c.model_extra["token_ids"]
        assert c.text == tiny_lm.decode(ids) and c.model_extra["policy_versions"] == [7] * len(ids)
        expected = recompute(tiny_lm, prompt, ids)
        assert np.allclose(c.logprobs.token_logprobs, expected.numpy(), atol=1e-4)
    by_ids = http.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert by_ids.model_extra["prompt_token_ids"] == prompt
    chat = http.chat.completions.create(model=MODEL, messages=[{"role": "user",
                                                               "content": "2+2="}],
                                        max_tokens=3, logprobs=True)
    choice = chat.choices[0]
    assert choice.message.role == "assistant"
    assert len(choice.logprobs.content) == len(choice.model_extra["token_ids"])


def test_openai_ignore_eos_as_vllm_takes_it(http):
    done = http.completions.create(model=MODEL, prompt="2+2=", max_tokens=4, n=8,
                                   temperature=5.0, seed=2, extra_body={"ignore_eos": True})
    assert [len(c.model_extra["token_ids"]) for c in done.choices] == [4] * 8
    assert {c.finish_reason for c in done.choices} == {"length"}


def test_openai_streams_chunks_that_add_up(http, tiny_lm):
    events = list(http.completions.create(model=MODEL, prompt="12+34=", max_tokens=5, n=2,
                                          logprobs=0, stream=True))
    prompt = tiny_lm.encode_prompt("12+34=")
    for i in range(2):
        mine = [e.choices[0] for e in events if e.choices[0].index == i]
        ids = [t for c in mine for t in c.model_extra["token_ids"]]
        assert 1 <= len(ids) <= 5 and len(mine) == (len(ids) + 1) // 2  # 2 tokens per event
        assert "".join(c.text for c in mine) == tiny_lm.decode(ids)
        assert [c.finish_reason for c in mine[:-1]] == [None] * (len(mine) - 1)
        assert mine[-1].finish_reason in ("stop", "length")
        logprobs = [lp for c in mine for lp in c.logprobs.token_logprobs]
        assert np.allclose(logprobs, recompute(tiny_lm, prompt, ids).numpy(), atol=1e-4)
    chat = list(http.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "3+4="}], max_tokens=5, stream=True))
    assert chat[0].choices[0].delta.role == "assistant"
    text = "".join(e.choices[0].delta.content for e in chat)
    ids = [t for e in chat for t in e.choices[0].model_extra["token_ids"]]
    assert text == tiny_lm.decode(ids) and chat[-1].choices[0].finish_reason is not None
    assert all(e.model_extra["policy_version"] == 7 for e in chat)


def test_openai_bad_requests_are_refused_by_name(http):
    with pytest.raises(openai.BadRequestError, match="completions.max_tokens"):
        http.completions.create(model=MODEL, prompt="1+1=", max_tokens=500)
    with pytest.raises(openai.NotFoundError, match="model"):
        http.completions.create(model="gpt-9", prompt="1+1=")
    with pytest.raises(openai.BadRequestError, match="stop: Extra inputs"):
        http.completions.create(model=MODEL, prompt="1+1=", stop=["\n"])


@pytest.fixture
def redis(tmp_path):
    server = EmbeddedRedis(tmp_path)
    yield connect(server.url)
    server.shutdown()


def trajectory(**kw):
    base = dict(prompt_token_ids=[1, 5], response_token_ids=[6, 7, 8], logprobs=[-0.1, 0, -0.3],
                versions=[2, 2, 3], loss_mask=[1, 0, 1], reward=0.5, finish_reason="stop")
    base.update(kw)
    return buffer_pb2.Trajectory(**base)


def test_submit_writes_a_whole_group_under_an_external_id(redis):
    keys = RunKeys("sub")
    redis.set(keys.trainer_version, 3)
    subs = Submissions(redis, keys, group_size=2, max_pending=64)
    pid = subs.submit(buffer_pb2.SubmitRequest(trajectories=[trajectory(), trajectory()],
                                               source="agent"))
    assert pid > EXTERNAL_PROMPT_BASE
    samples = [decode_sample(f[b"data"]) for _, f in redis.xrange(keys.trajectories)]
    assert [s.prompt_id for s in samples] == [pid, pid]
    assert samples[0].loss_mask.tolist() == [1, 0, 1] and samples[0].oldest_version == 2


@pytest.mark.parametrize("trajs,field", [
    ([trajectory()], "SubmitRequest.trajectories: 1 given"),
    ([trajectory(), trajectory(versions=[2, 2, 9])], "trajectories[1].versions: version 9"),
    ([trajectory(), trajectory(logprobs=[-1.0])], "trajectories[1].logprobs"),
    ([trajectory(loss_mask=[1, 2, 1]), trajectory()], "trajectories[0].loss_mask"),
    ([trajectory(loss_mask=[0, 0, 0]), trajectory()], "trajectories[0].loss_mask"),
    ([trajectory(response_token_ids=[]), trajectory()], "trajectories[0].response_tokens"),
])
def test_bad_submissions_are_refused_by_name_and_write_nothing(redis, trajs, field):
    keys = RunKeys("sub")
    redis.set(keys.trainer_version, 3)
    subs = Submissions(redis, keys, group_size=2, max_pending=64)
    with pytest.raises(CodecError, match=field.replace("[", r"\[").replace("]", r"\]")):
        subs.submit(buffer_pb2.SubmitRequest(trajectories=trajs))
    assert redis.xlen(keys.trajectories) == 0 and redis.get(keys.external_ids) is None
    assert subs.refused == 1
