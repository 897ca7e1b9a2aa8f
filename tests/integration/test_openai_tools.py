"""Function calling through the OpenAI-compatible server, with the official `openai` client,
on a real model and tokenizer (a tiny Llama with SmolLM2's): `tools` reach the prompt, the
model's call comes back as `tool_calls` with its token ids, log-probabilities and versions,
the assistant turn sent back is rendered as the tokens the model wrote, so the turns make one
trajectory whose tool result is masked; bad tool requests are refused by name. The model's
replies are scripted (a random model writes no calls); the server's path is its own."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from relayrl.config import RolloutConfig
from relayrl.plugins.buffer_client import ChatTurn, trajectory_from_turns
from relayrl.plugins.chat import ToolCall, hermes_text
from relayrl.runtime import auth
from relayrl_testkit.families import build_family
from relayrl_torch.models.loading import load_model
from relayrl_torch.models.smollm2 import ensure_smollm2
from rollout_svc.engines.torch import TorchEngine
from rollout_svc.serving.generator import CustomGenerator
from rollout_svc.serving.openai_server import OpenAIServer
from tests.conftest import free_ports

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tool-policy"
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}
CALL = hermes_text([ToolCall("add", {"a": 2, "b": 3})])
QUESTION = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A worker's OpenAI server over a torch engine whose replies follow `script`."""
    lm = load_model(build_family("llama", tmp_path_factory.mktemp("oa") / "llama",
                                 ensure_smollm2(ROOT / ".cache/relayrl/models")))
    engine = TorchEngine(lm, seed=0, version=3)
    script: list[str] = []
    generate = engine.generate

    def scripted(prompts, spec):
        outs = generate(prompts, spec)
        if script:
            tokens = lm.tokenizer.encode(script.pop(0), add_special_tokens=False) \
                + [lm.eos_ids[0]]
            for o in outs:
                o.tokens, o.finish_reason = tokens, "stop"
                o.logprobs = (o.logprobs * len(tokens))[:len(tokens)]
        return outs

    engine.generate = scripted
    gen = CustomGenerator(engine, lm, RolloutConfig(max_new_tokens=64))
    (port,) = free_ports(1)
    server = OpenAIServer(gen, "127.0.0.1", port, MODEL)
    server.start()
    client = openai.OpenAI(base_url=f"{server.address}/v1",
                           api_key=auth.current().token or "unused", max_retries=0)
    yield client, script, server, lm, gen
    server.stop()


def turn(resp) -> ChatTurn:
    c = resp.choices[0]
    return ChatTurn(resp.model_extra["prompt_token_ids"], c.model_extra["token_ids"],
                    [t.logprob for t in c.logprobs.content], c.model_extra["policy_versions"])


def test_a_tool_call_comes_back_and_the_turns_make_one_trajectory(served):
    client, script, _, lm, _ = served
    script[:] = [f"Let me add. {CALL}", "The answer is 5."]
    messages = list(QUESTION)
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[ADD],
                                           logprobs=True, max_tokens=64)
    prompt = lm.tokenizer.decode(first.model_extra["prompt_token_ids"])
    assert '"name": "add"' in prompt  # declared to the model (SmolLM2's template: in system)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me add."
    [call] = choice.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2,
                                                                                  "b": 3}
    assert choice.model_extra["policy_versions"] == [3] * len(choice.model_extra["token_ids"])
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[ADD],
                                            logprobs=True, max_tokens=64)
    assert second.choices[0].message.content == "The answer is 5."
    assert second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls
    t = trajectory_from_turns([turn(first), turn(second)], 1.0)
    mask = list(t.loss_mask)
    policy = [tok for tok, m in zip(t.response_tokens, mask, strict=True) if m]
    masked = [tok for tok, m in zip(t.response_tokens, mask, strict=True) if not m]
    assert lm.tokenizer.decode(policy, skip_special_tokens=True) == \
        f"Let me add. {CALL}The answer is 5."
    assert "5" in lm.tokenizer.decode(masked)  # the tool's result, masked from the loss
    assert all(lp == 0 for lp, m in zip(t.logprobs, mask, strict=True) if not m)


def test_worked_examples_before_the_models_turns_keep_the_turns_one_sequence(served):
    """A few-shot prompt's assistant turns, written by the agent, are rendered by the
    template; the model's turns after them are recalled, so each prompt extends the last."""
    client, script, _, _, _ = served
    # written as no template re-renders it: only its own tokens extend the prompt
    script[:] = ['<tool_call>\n{"name":"add","arguments":{"a":2,"b":3}}\n</tool_call>', "5"]
    worked = [{"role": "user", "content": "What is 1+1?"},
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "worked-0", "type": "function", "function": {
                      "name": "add", "arguments": '{"a": 1, "b": 1}'}}]},
              {"role": "tool", "tool_call_id": "worked-0", "content": "2"},
              {"role": "assistant", "content": "2"}]
    messages = [*worked, *QUESTION]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[ADD],
                                           logprobs=True, max_tokens=64)
    [call] = first.choices[0].message.tool_calls
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[ADD],
                                            logprobs=True, max_tokens=64)
    before = first.model_extra["prompt_token_ids"] + first.choices[0].model_extra["token_ids"]
    assert second.model_extra["prompt_token_ids"][:len(before)] == before
    trajectory_from_turns([turn(first), turn(second)], 1.0)  # one sequence


def test_a_streamed_tool_call_comes_in_deltas_and_its_turn_is_remembered(served):
    """Streaming with tools: the chunks carry the token ids, a last delta the call (as the
    official client accumulates it), and the turn sent back extends the prompt exactly."""
    client, script, _, _, _ = served
    script[:] = ['<tool_call>\n{"name":"add","arguments":{"a":2,"b":3}}\n</tool_call>', "5"]
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[ADD],
                                                 stream=True, max_tokens=64))
    ids = [t for c in chunks for ch in c.choices for t in ch.model_extra["token_ids"]]
    calls = [d for c in chunks for ch in c.choices for d in ch.delta.tool_calls or ()]
    [call] = calls
    assert call.index == 0 and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {
            "name": "add", "arguments": call.function.arguments}}]}
    second = client.chat.completions.create(model=MODEL, max_tokens=64, tools=[ADD], messages=[
        *QUESTION, message, {"role": "tool", "tool_call_id": call.id, "content": "5"}])
    assert second.choices[0].message.content == "5"
    extended = second.model_extra["prompt_token_ids"]
    assert ids and any(extended[k:k + len(ids)] == ids for k in range(len(extended)))


def test_a_call_of_a_function_not_declared_comes_back_as_text(served):
    client, script, _, _, _ = served
    script[:] = ['<tool_call>\n{"name": "$2.00 or so", "arguments": {}}\n</tool_call>']
    resp = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[ADD],
                                          max_tokens=64)
    assert not resp.choices[0].message.tool_calls
    assert "$2.00" in resp.choices[0].message.content


def test_a_turn_the_server_did_not_write_is_rendered_by_the_template(served):
    client, script, _, lm, _ = served
    script[:] = ["4"]
    messages = [*QUESTION, {"role": "assistant", "content": "It is 6."},
                {"role": "user", "content": "Sure?"}]
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
    assert resp.choices[0].message.content == "4"
    # the unknown assistant turn is in the prompt, as the template renders it
    assert "It is 6." in lm.tokenizer.decode(resp.model_extra["prompt_token_ids"])
    with pytest.raises(ValueError, match=r"turns\[1\].prompt_token_ids: does not extend"):
        trajectory_from_turns([ChatTurn([1, 2], [3], [0.0], [0]),
                               ChatTurn([1, 2, 4, 5], [6], [0.0], [0])], 1.0)


@pytest.mark.parametrize("extra, param, says", [
    ({"tools": [ADD], "tool_choice": "required"}, None,
     "tool_choice: 'required' needs the vllm engine's structured outputs"),
    ({"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "sub"}}},
     "tool_choice", "function 'sub' is not among tools"),
    ({"tools": [ADD, ADD]}, "tools", "two functions have the same name"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]},
     "tools.0.function.name", "String should match pattern"),
    ({"messages": [*QUESTION, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "2, 3"}}]}]},
     "messages.1.tool_calls.0.function.arguments", "not a JSON object"),
    ({"messages": [{"role": "user", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]}]},
     "messages.0.tool_calls", "only an assistant message makes calls"),
    ({"messages": [{"role": "assistant"}]}, "messages.0.content", "a message needs content"),
])
def test_bad_tool_requests_are_refused_by_name(served, extra, param, says):
    client = served[0]
    body = {"model": MODEL, "messages": QUESTION, **extra}
    resp = httpx.post(f"{client.base_url}chat/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {client.api_key}"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and says in error["message"], error



def test_one_agents_turns_survive_another_agents_flood(served):
    """Each agent token has a turn memory of its own: agent B's turns past its quota evict
    only B's, so agent A's assistant turn sent back is still the tokens the model wrote."""
    from relayrl.runtime.roles import AGENT, BEARER, Holder, TokenBook
    from rollout_svc.serving.chat_turns import TurnMemories

    _, script, _, lm, gen = served
    book = TokenBook(tuple(Holder((BEARER + t).encode(), frozenset({AGENT}), env)
                           for t, env in (("token-a", "AGENT_A"), ("token-b", "AGENT_B"))))
    (port,) = free_ports(1)
    server = OpenAIServer(gen, "127.0.0.1", port, MODEL,
                          credentials=auth.Credentials(token="token-a", accepted=book),
                          turns=(memories := TurnMemories(per_agent=2)))
    server.start()
    try:
        a, b = (openai.OpenAI(base_url=f"{server.address}/v1", api_key=key, max_retries=0)
                for key in ("token-a", "token-b"))
        script[:] = ["It is 5.", "1", "2", "3", "Yes."]
        first = a.chat.completions.create(model=MODEL, messages=QUESTION, logprobs=True,
                                          max_tokens=16)
        for i in range(3):  # more turns than B's quota: B's memory evicts its own
            b.chat.completions.create(model=MODEL, max_tokens=16, messages=[
                {"role": "user", "content": f"Count {i}"}])
        again = a.chat.completions.create(model=MODEL, logprobs=True, max_tokens=16, messages=[
            *QUESTION, first.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "Sure?"}])
        trajectory_from_turns([turn(first), turn(again)], 1.0)  # an exact extension
        mine = memories.of(BEARER + "token-a")
        assert (mine.recalled, mine.rerendered) == (1, 0)  # from memory, not the template
        assert memories.of(BEARER + "token-b").evicted == 1
    finally:
        server.stop()


def test_the_api_answers_over_https_verified_by_the_runs_ca(served, tmp_path):
    """With auth.tls set the OpenAI-compatible API serves TLS: the official client verified
    against the run's CA gets its completion; one that trusts only the system's roots, or
    speaks plaintext, gets nothing."""
    from tests.integration.tls_certs import self_signed

    _, script, _, _, gen = served
    cert, key = self_signed(tmp_path, "127.0.0.1")
    from relayrl.config.security import TlsConfig

    tls = auth.load_tls(TlsConfig(cert=str(cert), key=str(key), ca=str(cert)))
    (port,) = free_ports(1)
    server = OpenAIServer(gen, "127.0.0.1", port, MODEL,
                          credentials=auth.Credentials(token="t0k", tls=tls))
    server.start()
    try:
        assert server.address.startswith("https://")
        script[:] = ["4"]
        client = openai.OpenAI(base_url=f"{server.address}/v1", api_key="t0k", max_retries=0,
                               http_client=httpx.Client(verify=str(cert)))
        resp = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8)
        assert resp.choices[0].message.content == "4"
        for base, verify in ((server.address, True),
                             (server.address.replace("https://", "http://"), str(cert))):
            untrusted = openai.OpenAI(base_url=f"{base}/v1", api_key="t0k", max_retries=0,
                                      http_client=httpx.Client(verify=verify))
            with pytest.raises(openai.APIConnectionError):
                untrusted.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8)
    finally:
        server.stop()
