"""The OpenAI request fields the server takes as vLLM's and OpenAI's servers do (stop,
stream_options, metadata, content parts, top_logprobs, response_format text), through the
real app on the torch engine and a tiny model, and the refusals of what it does not do,
each naming the field, the value and the limit."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from relayrl.config import RolloutConfig
from rollout_svc.engines.torch import TorchEngine
from rollout_svc.serving.generator import CustomGenerator
from rollout_svc.serving.openai_server import build_app

MODEL = "m"


@pytest.fixture(scope="module")
def app(chat_lm):
    gen = CustomGenerator(TorchEngine(chat_lm, seed=0, version=3), chat_lm,
                          RolloutConfig(max_new_tokens=24, max_prompt_tokens=200))
    with TestClient(build_app(gen, MODEL, stream_chunk_tokens=3)) as client:
        yield client, chat_lm


def post(client, path: str, **body):
    return client.post(f"/v1/{path}", json={"model": MODEL, **body})


def refused(client, path: str, **body) -> dict:
    resp = post(client, path, **body)
    assert resp.status_code == 400, resp.text
    return resp.json()["error"]


def events(resp) -> list[dict]:
    lines = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def a_stop(text: str, starts=None) -> tuple[str, int]:
    """A two-character stop string from the middle of `text` (starting at one of `starts`,
    when given) and where it first occurs."""
    for k in starts or range(4, len(text) - 2):
        if text.find(text[k:k + 2]) == k:
            return text[k:k + 2], k
    raise AssertionError(f"no stop string to pick from {text!r}")


def fewest_tokens(lm, tokens: list[int], stop: str) -> int:
    return next(k for k in range(1, len(tokens) + 1) if stop in lm.decode(tokens[:k]))


GREEDY = dict(temperature=0, max_tokens=24, ignore_eos=True)
SEEDED = dict(temperature=1.0, seed=5, max_tokens=24, ignore_eos=True)  # the same draws


def test_completions_stop_at_the_token_completing_a_stop_string(app):
    client, lm = app
    whole = post(client, "completions", prompt="12+34=", **SEEDED).json()["choices"][0]
    stop, at = a_stop(whole["text"])
    done = post(client, "completions", prompt="12+34=", stop=["99999", stop], logprobs=0,
                **SEEDED).json()
    c = done["choices"][0]
    keep = fewest_tokens(lm, whole["token_ids"], stop)
    assert c["text"] == whole["text"][:at] and c["finish_reason"] == "stop"
    assert c["token_ids"] == whole["token_ids"][:keep]  # the stop string's tokens are kept
    assert len(c["logprobs"]["token_logprobs"]) == keep == len(c["policy_versions"])
    assert done["usage"]["completion_tokens"] == keep
    single = post(client, "completions", prompt="12+34=", stop=stop, **SEEDED).json()
    assert single["choices"][0]["token_ids"] == c["token_ids"]


def test_a_streamed_stop_sends_no_character_of_the_stop_string(app):
    client, lm = app
    # a seeded stream draws each chunk from a seed of its own: compare streams
    whole = events(post(client, "completions", prompt="7+8=", stream=True, **SEEDED))
    text = "".join(e["choices"][0]["text"] for e in whole)
    tokens = [t for e in whole for t in e["choices"][0]["token_ids"]]
    assert text == lm.decode(tokens)
    ends, sent = [], 0
    for e in whole[:-1]:
        sent += len(e["choices"][0]["text"])
        ends.append(sent - 1)
    stop, at = a_stop(text, ends)  # across two chunks: its first character is held back
    got = events(post(client, "completions", prompt="7+8=", stop=[stop], stream=True,
                      **SEEDED))
    assert "".join(e["choices"][0]["text"] for e in got) == text[:at]
    ids = [t for e in got for t in e["choices"][0]["token_ids"]]
    assert ids == tokens[:fewest_tokens(lm, tokens, stop)]
    assert got[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_chat_turn_cut_by_a_stop_string_is_extended_by_the_next(app):
    client, lm = app
    messages = [{"role": "user", "content": "12+34"}]
    whole = post(client, "chat/completions", messages=messages, **SEEDED).json()
    stop, at = a_stop(whole["choices"][0]["message"]["content"])
    first = post(client, "chat/completions", messages=messages, stop=stop, **SEEDED).json()
    c = first["choices"][0]
    assert c["message"]["content"] == whole["choices"][0]["message"]["content"][:at]
    assert c["finish_reason"] == "stop" and stop in lm.decode(c["token_ids"])
    messages += [c["message"], {"role": "user", "content": "5"}]
    second = post(client, "chat/completions", messages=messages, max_tokens=2).json()
    before = first["prompt_token_ids"] + c["token_ids"]
    # the turn as the model wrote it (its stop string too), then the template's closing
    assert second["prompt_token_ids"][:len(before)] == before
    assert second["prompt_token_ids"][len(before)] in lm.eos_ids


@pytest.mark.parametrize("stop,param,message", [
    ([str(i) for i in range(17)], "stop", "stop: 17 strings, more than 16"),
    ([""], "stop.0", "stop.0: must be a string of 1..256 characters, got ''"),
    (["1", "x" * 257], "stop.1", "stop.1: must be a string of 1..256 characters, got 'xxx"),
    ("", "stop", "stop: must be a string of 1..256 characters, got ''"),
])
def test_stop_strings_past_the_bounds_are_refused_by_name(app, stop, param, message):
    error = refused(app[0], "completions", prompt="1+1=", stop=stop)
    assert error["param"] == param and error["message"].startswith(message)
    error = refused(app[0], "chat/completions", stop=stop,
                    messages=[{"role": "user", "content": "1"}])
    assert error["param"] == param


def test_stream_options_include_usage_ends_with_the_usage(app):
    client, _ = app
    got = events(post(client, "chat/completions", messages=[{"role": "user", "content": "3"}],
                      stream=True, stream_options={"include_usage": True}, max_tokens=7))
    *chunks, last = got
    assert last["choices"] == [] and all(e["usage"] is None for e in chunks)
    made = sum(len(e["choices"][0]["token_ids"]) for e in chunks)
    assert last["usage"]["completion_tokens"] == made >= 1
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + made
    plain = events(post(client, "completions", prompt="3", stream=True, max_tokens=4,
                        stream_options={"include_usage": False}))
    assert all("usage" not in e and e["choices"] for e in plain)
    error = refused(client, "completions", prompt="3", stream_options={"include_usage": True})
    assert error["message"] == "stream_options: only with stream true"
    error = refused(client, "completions", prompt="3", stream=True,
                    stream_options={"include_usage": 1})
    assert error["param"] == "stream_options.include_usage"


def test_metadata_is_taken_within_openais_bounds(app):
    client, _ = app
    assert post(client, "completions", prompt="1", max_tokens=1,
                metadata={"episode": "7", "task": "add"}).status_code == 200
    error = refused(client, "completions", prompt="1",
                    metadata={str(i): "v" for i in range(17)})
    assert error["message"] == "metadata: 17 keys, more than 16"
    error = refused(client, "completions", prompt="1", metadata={"k" * 65: "v"})
    assert "has 65 characters, more than 64" in error["message"]
    error = refused(client, "chat/completions", messages=[{"role": "user", "content": "1"}],
                    metadata={"k": "v" * 513})
    assert error["message"] == "metadata: the value of 'k' has 513 characters, more than 512"
    assert refused(client, "completions", prompt="1", metadata={"k": 1})["param"] == \
        "metadata.k"


def test_text_parts_are_joined_and_other_parts_refused_by_name(app):
    client, _ = app
    parts = post(client, "chat/completions", max_tokens=1, messages=[
        {"role": "user", "content": [{"type": "text", "text": "12"},
                                     {"type": "text", "text": "34"}]}]).json()
    text = post(client, "chat/completions", max_tokens=1,
                messages=[{"role": "user", "content": "12\n34"}]).json()
    assert parts["prompt_token_ids"] == text["prompt_token_ids"]
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    error = refused(client, "chat/completions", messages=[
        {"role": "user", "content": "1"},
        {"role": "user", "content": [{"type": "text", "text": "1"}, image]}])
    assert error["message"] == ("messages.1.content.1.type: 'image_url' is not supported: "
                                "this model takes text")
    assert error["param"] == "messages.1.content.1.type"
    error = refused(client, "chat/completions", messages=[
        {"role": "user", "content": [{"type": "text", "text": "1", "cache": True}]}])
    assert error["param"] == "messages.0.content.0.cache"
    error = refused(client, "chat/completions", messages=[{"role": "user", "content": []}])
    assert error["message"] == "messages.0.content: an empty list of parts"


def test_top_logprobs_are_the_most_likely_tokens_of_each_position(app):
    client, lm = app
    chat = post(client, "chat/completions", messages=[{"role": "user", "content": "5"}],
                logprobs=True, top_logprobs=3, **GREEDY).json()["choices"][0]
    for entry in chat["logprobs"]["content"]:
        top = [t["logprob"] for t in entry["top_logprobs"]]
        assert len(top) == 3 and top == sorted(top, reverse=True)
        assert entry["logprob"] == pytest.approx(top[0])  # greedy picks the most likely
        assert entry["token"] == entry["top_logprobs"][0]["token"]
    done = post(client, "completions", prompt="5", logprobs=2, **GREEDY).json()["choices"][0]
    for lp, top in zip(done["logprobs"]["token_logprobs"], done["logprobs"]["top_logprobs"],
                       strict=True):
        assert 1 <= len(top) <= 2 and lp == pytest.approx(max(top.values()))
    none = post(client, "completions", prompt="5", logprobs=0, max_tokens=2).json()
    assert none["choices"][0]["logprobs"]["top_logprobs"] is None


@pytest.mark.parametrize("path,body,param,message", [
    ("chat/completions", dict(logprobs=True, top_logprobs=21), "top_logprobs",
     "top_logprobs: Input should be less than or equal to 20, got 21"),
    ("chat/completions", dict(top_logprobs=2), "top_logprobs",
     "top_logprobs: needs logprobs true"),
    ("completions", dict(logprobs=21), "logprobs",
     "logprobs: Input should be less than or equal to 20, got 21"),
])
def test_top_logprobs_past_the_bound_are_refused_by_name(app, path, body, param, message):
    where = {"messages": [{"role": "user", "content": "1"}]} if path.startswith("chat") \
        else {"prompt": "1"}
    error = refused(app[0], path, **where, **body)
    assert (error["param"], error["message"]) == (param, message)


def test_response_format_text_is_taken_and_json_refused_on_the_torch_engine(app):
    client, _ = app
    messages = [{"role": "user", "content": "1"}]
    assert post(client, "chat/completions", messages=messages, max_tokens=1,
                response_format={"type": "text"}).status_code == 200
    schema = {"name": "n", "schema": {"type": "integer"}}
    for kind, extra in (("json_object", {}), ("json_schema", {"json_schema": schema})):
        error = refused(client, "chat/completions", messages=messages,
                        response_format={"type": kind, **extra})
        assert error["message"] == (
            f"chat.completions.response_format: {kind} needs the vllm engine's structured "
            "outputs (rollout.engine.kind: vllm); this worker runs the torch engine")
    error = refused(client, "chat/completions", messages=messages, stream=True,
                    response_format={"type": "json_schema", "json_schema": schema})
    assert error["param"] == "stream" and "only without streaming" in error["message"]
    error = refused(client, "chat/completions", messages=messages,
                    response_format={"type": "json_schema"})
    assert error["param"] == "response_format.json_schema"
    error = refused(client, "chat/completions", messages=messages,
                    response_format={"type": "json_schema", "json_schema": {"name": "n"}})
    assert error["param"] == "response_format.json_schema.schema"
    error = refused(client, "chat/completions", messages=messages,
                    response_format={"type": "yaml"})
    assert error["param"] == "response_format.type"


def test_a_forced_tool_choice_is_refused_on_the_torch_engine_with_the_reason(app):
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "1"}]
    for choice, shown in (("required", "'required'"),
                          ({"type": "function", "function": {"name": "add"}},
                           "{'type': 'function', 'function': {'name': 'add'}}")):
        error = refused(app[0], "chat/completions", tools=[tool], tool_choice=choice,
                        messages=messages)
        assert error["message"] == (
            f"chat.completions.tool_choice: {shown} needs the vllm engine's structured "
            "outputs (rollout.engine.kind: vllm); this worker runs the torch engine")
    for choice, message in (
            ({"type": "function", "function": {"name": "sub"}},
             "tool_choice: function 'sub' is not among tools"),
            ({"type": "function", "function": {"name": "add", "strict": True}},
             "tool_choice: {'type': 'function', 'function': {'name': 'add', 'strict': True}} "
             "is not supported: 'auto', 'none', 'required' or {'type': 'function', "
             "'function': {'name': ...}} are")):
        error = refused(app[0], "chat/completions", tools=[tool], tool_choice=choice,
                        messages=messages)
        assert (error["param"], error["message"]) == ("tool_choice", message)
    error = refused(app[0], "chat/completions", tool_choice="required", messages=messages)
    assert error["message"] == "tool_choice: 'required' needs tools"
    error = refused(app[0], "chat/completions", tools=[tool], tool_choice="required",
                    response_format={"type": "json_object"}, messages=messages)
    assert error["param"] == "response_format"
