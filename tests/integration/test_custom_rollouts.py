"""Custom rollouts on a real engine: the gRPC Generate API (unary and streaming) and the
OpenAI-compatible HTTP API through the official `openai` client, each refusing bad input by
name. The buffer's Submit API, where the rollouts go: tests/unit/test_submit.py."""

import grpc
import httpx
import numpy as np
import openai
import pytest
import torch

from relayrl.config import RolloutConfig
from relayrl.config.rollout import MAX_SEED
from relayrl.contracts.proto.v1 import rollout_pb2, rollout_pb2_grpc
from relayrl.runtime import auth
from relayrl.runtime.grpc_util import channel, make_server
from rollout_svc.engines.torch import TorchEngine
from rollout_svc.server import RolloutServicer
from rollout_svc.serving.generator import CustomGenerator
from rollout_svc.serving.openai_server import OpenAIServer
from tests.conftest import free_ports

MODEL = "test-policy"
LIMITS = dict(max_prompt_tokens=300, max_request_bytes=64 << 10)  # the context is 256


class NoWorker:
    """Generate needs no rollout loop; Status is not exercised here."""


@pytest.fixture(scope="module")
def generator(tiny_lm):
    return CustomGenerator(TorchEngine(tiny_lm, seed=0, version=7), tiny_lm,
                           RolloutConfig(max_new_tokens=5, temperature=1.0, **LIMITS))


@pytest.fixture(scope="module")
def grpc_address(generator):
    """A worker's gRPC server as rollout_svc.server builds it: its receive limit is
    rollout.max_request_bytes."""
    (port,) = free_ports(1)
    server, _ = make_server(f"127.0.0.1:{port}", [(
        rollout_pb2_grpc.add_RolloutServicer_to_server, RolloutServicer(NoWorker(), generator))],
        max_receive_bytes=generator.defaults.max_request_bytes)
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


@pytest.fixture(scope="module")
def grpc_stub(grpc_address):
    return rollout_pb2_grpc.RolloutStub(channel(grpc_address))


@pytest.fixture(scope="module")
def http(generator):
    (port,) = free_ports(1)
    server = OpenAIServer(generator, "127.0.0.1", port, MODEL, stream_chunk_tokens=2)
    server.start()
    token = auth.current().token or "unused"  # the server requires the process's, if any
    yield openai.OpenAI(base_url=f"{server.address}/v1", api_key=token, max_retries=0)
    server.stop()


@pytest.fixture
def raw_http(http):
    """Requests the openai client would not send (NaN, true for a number, huge bodies)."""
    with httpx.Client(base_url=str(http.base_url), timeout=30, headers={
            "Authorization": f"Bearer {http.api_key}",
            "Content-Type": "application/json"}) as client:
        yield client


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
    # what the engine once answered with UNKNOWN: probability tensor contains inf/nan
    (rollout_pb2.GenerateRequest(text="1+1=", temperature=1e-300),
     "GenerateRequest.temperature: must be 0 or in [0.01, 10.0], got 1e-300"),
    (rollout_pb2.GenerateRequest(text="1+1=", temperature=float("nan")), "got nan"),
    (rollout_pb2.GenerateRequest(text="1+1=", seed=-5), f"seed: must be in 0..{MAX_SEED}"),
    (rollout_pb2.GenerateRequest(token_ids=[5] * 301),
     "GenerateRequest.token_ids: 301 tokens, more than rollout.max_prompt_tokens (300)"),
    (rollout_pb2.GenerateRequest(token_ids=[5] * 254, max_new_tokens=5),
     "GenerateRequest.max_new_tokens: 254 prompt tokens + 5 exceed the model's context "
     "length (256)"),
])
def test_bad_generate_requests_name_the_field(grpc_stub, req, field):
    with pytest.raises(grpc.RpcError) as info:
        grpc_stub.Generate(req, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        list(grpc_stub.GenerateStream(req, timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_undecodable_and_oversized_messages_are_refused_by_name(grpc_address, grpc_stub):
    with channel(grpc_address) as ch:
        for method, call in (("Generate", ch.unary_unary),
                             ("GenerateStream", ch.unary_stream)):
            path = f"/relayrl.v1.Rollout/{method}"
            with pytest.raises(grpc.RpcError) as info:
                list(call(path)(b"\xff" * 7, timeout=30)) if method == "GenerateStream" \
                    else call(path)(b"\xff" * 7, timeout=30)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"{path}: the request is not a valid relayrl.v1.GenerateRequest" in (
                info.value.details())
    with pytest.raises(grpc.RpcError) as info:  # refused by gRPC before it is read
        grpc_stub.Generate(rollout_pb2.GenerateRequest(text="1" * (65 << 10)), timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(64 << 10) in info.value.details()


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


def test_openai_client_stop_strings_and_text_parts(http, tiny_lm):
    """A stop string ends the text before it and the token ids at the token completing it,
    through the openai client on both endpoints; content given as text parts is the same
    prompt as the joined text."""
    args = dict(model=MODEL, max_tokens=5, temperature=1.0, seed=9,
                extra_body={"ignore_eos": True})
    whole = http.completions.create(prompt="12+34=", **args).choices[0]
    ids = whole.model_extra["token_ids"]
    stop = next(whole.text[k:k + 2] for k in range(1, len(whole.text) - 1)
                if whole.text.find(whole.text[k:k + 2]) == k)
    keep = next(k for k in range(1, len(ids) + 1) if stop in tiny_lm.decode(ids[:k]))
    cut = http.completions.create(prompt="12+34=", stop=[stop], **args).choices[0]
    assert cut.text == whole.text[:whole.text.find(stop)] and cut.finish_reason == "stop"
    assert cut.model_extra["token_ids"] == ids[:keep]
    chat = dict(args, messages=[{"role": "user", "content": "12+34="}])
    said = http.chat.completions.create(**chat).choices[0]
    text, ids = said.message.content, said.model_extra["token_ids"]
    stop = next(text[k:k + 2] for k in range(1, len(text) - 1) if text.find(text[k:k + 2]) == k)
    keep = next(k for k in range(1, len(ids) + 1) if stop in tiny_lm.decode(ids[:k]))
    cut = http.chat.completions.create(**chat, stop=stop, logprobs=True).choices[0]
    assert cut.message.content == text[:text.find(stop)] and cut.finish_reason == "stop"
    assert cut.model_extra["token_ids"] == ids[:keep] and len(cut.logprobs.content) == keep
    parts = http.chat.completions.create(model=MODEL, max_tokens=1, messages=[
        {"role": "user", "content": [{"type": "text", "text": "12+"},
                                     {"type": "text", "text": "34="}]}])
    joined = http.chat.completions.create(model=MODEL, max_tokens=1, messages=[
        {"role": "user", "content": "12+\n34="}])
    assert parts.model_extra["prompt_token_ids"] == joined.model_extra["prompt_token_ids"]


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
    with pytest.raises(openai.BadRequestError, match="stop: 17 strings, more than 16"):
        http.completions.create(model=MODEL, prompt="1+1=", stop=[str(i) for i in range(17)])
    with pytest.raises(openai.BadRequestError, match="messages.0.content.0.type: 'image_url' "
                                                     "is not supported: this model takes text"):
        http.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}]}])
    with pytest.raises(openai.BadRequestError,
                       match=f"seed: Input should be less than or equal to {MAX_SEED}, got "
                             f"{2**70}"):  # once a 500
        http.completions.create(model=MODEL, prompt="1+1=", seed=2**70)
    with pytest.raises(openai.BadRequestError, match=r"chat.completions.temperature: must be "
                                                     r"0 or in \[0.01, 10.0\], got 1e-300"):
        http.chat.completions.create(model=MODEL, temperature=1e-300,
                                     messages=[{"role": "user", "content": "1+1="}])
    with pytest.raises(openai.BadRequestError,
                       match=r"completions.prompt: 301 tokens, more than "
                             r"rollout.max_prompt_tokens \(300\)"):
        http.completions.create(model=MODEL, prompt=[5] * 301)
    with pytest.raises(openai.BadRequestError, match=r"chat.completions.max_tokens: .* exceed "
                                                     r"the model's context length \(256\)"):
        http.chat.completions.create(model=MODEL, max_tokens=5, messages=[
            {"role": "user", "content": "1+1=" * 63}])


@pytest.mark.parametrize("body,param", [
    ('{"model": "test-policy", "prompt": "1+1=", "temperature": NaN}', "temperature"),
    ('{"model": "test-policy", "prompt": "1+1=", "temperature": Infinity}', "temperature"),
    ('{"model": "test-policy", "prompt": "1+1=", "n": true}', "n"),
    ('{"model": "test-policy", "prompt": "1+1=", "max_tokens": "3"}', "max_tokens"),
])
def test_openai_requests_are_strictly_typed(raw_http, body, param):
    resp = raw_http.post("/completions", content=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_a_huge_chat_message_is_refused_before_it_is_read(raw_http):
    big = '{"model": "test-policy", "messages": [{"role": "user", "content": "%s"}]}' % (
        "1" * (10 << 20))
    resp = raw_http.post("/chat/completions", content=big)
    assert resp.status_code == 413
    assert resp.json()["error"]["message"] == (
        f"request body: {len(big)} bytes, more than rollout.max_request_bytes ({64 << 10})")

    def chunked():  # no Content-Length: refused once the bytes read pass the limit
        yield big[:1000].encode()
        yield big[1000:].encode()

    resp = raw_http.post("/chat/completions", content=chunked())
    assert resp.status_code == 413 and "over 65536 bytes" in resp.json()["error"]["message"]
