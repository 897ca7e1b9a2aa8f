"""Function calling: tool calls are read in the template families' formats, declared tools
are rendered through the chat template (or the system message when it ignores them), and
every bad call — malformed, unknown, with arguments that do not fit, raising, hanging, too
many, or answering 5 MB — is answered to the model as a counted tool error while the episode
goes on."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import pytest

from relayrl.config import ConfigError
from relayrl.plugins.chat import (
    ToolCall,
    hermes_text,
    parse_tool_calls,
    render_chat,
    takes_tools,
    with_tool_prompt,
)
from relayrl.plugins.envs import Tool, ToolEnvironment
from relayrl.plugins.envs.tools import check_deadlines, declared_tools
from relayrl.plugins.tasks.problem import Problem

RELEASE = threading.Event()


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def fail(reason: str) -> str:
    """Raise.

    Args:
        reason: What to raise with.
    """
    raise RuntimeError(reason)


def hang(seconds: float) -> str:
    """Block until released.

    Args:
        seconds: How long at most.
    """
    RELEASE.wait(seconds)
    return "late"


def flood(chars: int) -> str:
    """A long result.

    Args:
        chars: Its length.
    """
    return "x" * chars


async def echo(text: str) -> dict:
    """Echo, asynchronously.

    Args:
        text: What to echo.
    """
    await asyncio.sleep(0)
    return {"echo": text}


WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
        "required": ["city"]}}}


class Desk(ToolEnvironment):
    tools = [add, fail, hang, flood, echo,
             Tool(WEATHER, lambda city, unit="C": f"sunny in {city}, 20 {unit}")]


def call(name: str, **arguments) -> str:
    return hermes_text([ToolCall(name, arguments)])


def answers(env: ToolEnvironment, reply: str) -> list[str]:
    step = env.step(reply)
    assert not step.done and step.reward is None
    assert all(m["role"] == "tool" for m in step.messages)
    return [m["content"] for m in step.messages]


@pytest.fixture
def desk():
    RELEASE.clear()
    env = Desk(tool_timeout_s=0.5, max_result_chars=100, max_calls_per_turn=3)
    env.reset(Problem(1, "What is 2+3?", "5"))
    yield env
    RELEASE.set()


@pytest.mark.parametrize("text, calls, content", [
    ('Let me add. <tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
     [ToolCall("add", {"a": 2, "b": 3})], "Let me add."),
    ('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 1}"}</tool_call>'
     '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}',  # the last one unclosed
     [ToolCall("add", {"a": 1, "b": 1}), ToolCall("echo", {"text": "hi"})], ""),
    ('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]',
     [ToolCall("add", {"a": 1, "b": 2})], ""),
    ('[{"name": "add", "arguments": {"a": 1, "b": 2}}]',  # Mistral with its token decoded away
     [ToolCall("add", {"a": 1, "b": 2})], ""),
    ('{"name": "add", "parameters": {"a": 1, "b": 2}}', [ToolCall("add", {"a": 1, "b": 2})],
     ""),  # Llama 3
    ("The answer is 5.", [], "The answer is 5."),
    ('{"answer": 5}', [], '{"answer": 5}'),  # JSON that is not a call is an answer
])
def test_calls_are_read_in_each_familys_format(text, calls, content):
    reply = parse_tool_calls(text)
    assert reply.calls == calls and reply.content == content and not reply.malformed


@pytest.mark.parametrize("text, reason", [
    ("<tool_call>{add(2, 3)}</tool_call>", "the call is not JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', 'a call must be an object with a string "name"'),
    ('<tool_call>{"name": "add", "arguments": "a=2"}</tool_call>',
     "add: the arguments are not JSON"),
    ('<tool_call>{"name": "add", "arguments": [2, 3]}</tool_call>',
     "add: the arguments must be an object, not list"),
])
def test_a_malformed_call_is_reported_not_dropped(text, reason):
    reply = parse_tool_calls(text)
    assert not reply.calls and len(reply.malformed) == 1 and reason in reply.malformed[0]


def test_calls_run_and_answer_in_order(desk):
    reply = call("add", a=2, b=3) + call("echo", text="hi") + call("weather", city="Oslo")
    assert answers(desk, reply) == ["5", '{"echo": "hi"}', "sunny in Oslo, 20 C"]
    assert desk.take_counts() == (3, {})


def test_a_reply_without_a_call_is_the_answer_and_ends_the_episode(desk):
    step = desk.step("The answer is 5.")
    assert step.done and not step.messages and step.reward is None  # the task's reward scores


@pytest.mark.parametrize("reply, kind, says", [
    ("<tool_call>{add 2 3}</tool_call>", "malformed", "error: the call is not JSON"),
    (call("subtract", a=2, b=3), "unknown_tool",
     "error: no tool is named 'subtract'; the tools are add, echo, fail, flood, hang, weather"),
    (call("add", a=2), "bad_arguments", "error: add: missing argument 'b'"),
    (call("add", a=2, b=3, c=4), "bad_arguments", "error: add: unknown argument 'c'"),
    (call("add", a="two", b=3), "bad_arguments",
     "error: add: argument 'a' is \"two\", not number"),
    (call("add", a=True, b=3), "bad_arguments", "error: add: argument 'a' is true, not number"),
    (call("weather", city="Oslo", unit="K"), "bad_arguments",
     "error: weather: argument 'unit' is \"K\", not one of ['C', 'F']"),
    (call("fail", reason="no disk"), "raised", "error: fail: RuntimeError: no disk"),
    (call("hang", seconds=30), "tool_timeout_s", "error: hang: no result within 0.5 s"),
])
def test_a_bad_call_is_a_counted_tool_error_and_the_episode_goes_on(desk, reply, kind, says):
    [answer] = answers(desk, reply)
    assert answer.startswith(says), answer
    assert desk.take_counts() == (1, {kind: 1})


def test_a_huge_result_is_cut_and_counted(desk):
    started = time.monotonic()
    [answer] = answers(desk, call("flood", chars=5_000_000))
    assert answer == "x" * 100 + "\n[cut: the result held 5000000 characters, 100 are shown]"
    assert desk.take_counts() == (1, {"max_result_chars": 1})
    assert time.monotonic() - started < 5  # cut before anything reads it further


def test_calls_past_the_per_turn_limit_are_not_run(desk):
    reply = "".join(call("add", a=i, b=0) for i in range(5))
    assert answers(desk, reply) == ["0", "1", "2"] + [
        "error: add: not run, the reply made more than 3 calls"] * 2
    assert desk.take_counts() == (5, {"max_calls_per_turn": 2})


def test_a_turns_calls_run_at_once():
    """Four calls that each block until all four are running: one after another, each would
    wait out its deadline."""
    barrier = threading.Barrier(4)

    def meet(i: int) -> int:
        """Wait for the others.

        Args:
            i: Which call.
        """
        barrier.wait(5)
        return i

    class Together(ToolEnvironment):
        tools = [meet]

    env = Together(tool_timeout_s=10)
    assert answers(env, "".join(call("meet", i=i) for i in range(4))) == ["0", "1", "2", "3"]


def test_at_most_max_concurrent_tools_run_at_once():
    running, peak, lock = [0], [0], threading.Lock()

    def busy(i: int) -> int:
        """Hold a slot for a moment.

        Args:
            i: Which call.
        """
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return i

    class Busy(ToolEnvironment):
        tools = [busy]

    env = Busy(tool_timeout_s=10, max_concurrent_tools=2, max_calls_per_turn=8)
    assert answers(env, "".join(call("busy", i=i) for i in range(6))) == [str(i)
                                                                         for i in range(6)]
    assert peak[0] == 2


def test_tools_are_checked_when_the_class_is_loaded():
    def undocumented(a: int) -> int:
        return a

    class Bad(ToolEnvironment):
        tools = [undocumented]

    with pytest.raises(ConfigError, match="Bad.tools: 'undocumented': .*docstring"):
        Bad()

    class Twice(ToolEnvironment):
        tools = [add, add]

    with pytest.raises(ConfigError, match="Twice.tools: two tools are named 'add'"):
        Twice()

    class Empty(ToolEnvironment):
        pass

    with pytest.raises(ConfigError, match="Empty.tools: declare at least one tool"):
        Empty()
    with pytest.raises(ConfigError, match="options.tool_timeout_s: 0 must be a number above 0"):
        Desk(tool_timeout_s=0)


def test_a_tool_deadline_must_fit_inside_the_step_deadline():
    check_deadlines(Desk(tool_timeout_s=5), 60)
    with pytest.raises(ConfigError, match=r"tool_timeout_s: 60 must be below rollout"
                                          r"\.environment\.step_timeout_s \(60\)"):
        check_deadlines(Desk(tool_timeout_s=60), 60)


def test_declared_tools_are_openai_schemas():
    schemas = {s["function"]["name"]: s for s in declared_tools(Desk)}
    assert schemas["add"]["function"]["parameters"]["required"] == ["a", "b"]
    assert schemas["weather"] == WEATHER
    assert declared_tools(ToolEnvironment.__mro__[1]) is None  # a plain Environment


# A Hermes-style template that renders tools itself, as Qwen's and Hermes' do.
HERMES = (
    "{% if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] }}\n{% endif %}<tools>{% for t in tools %}\n{{ t | tojson }}"
    "{% endfor %}\n</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if not (tools and loop.first and m['role'] == 'system') %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class Words:
    """A tokenizer over characters, enough to render templates."""
    def __init__(self, template: str):
        self.chat_template = template

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, **_):
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered, _ = render_jinja_template([messages], tools=tools, chat_template=(
            self.chat_template), add_generation_prompt=add_generation_prompt)
        return [ord(c) for c in rendered[0]]


def text(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def test_a_template_that_takes_tools_renders_them_itself():
    tok = Words(HERMES)
    assert takes_tools(tok)
    out = text(render_chat(tok, [{"role": "user", "content": "2+3?"}], tools=[WEATHER]))
    assert out.startswith("<|im_start|>system\n<tools>" + json.dumps(WEATHER) + "</tools>")
    assert "You can call functions" not in out  # not described twice


def test_a_template_that_ignores_tools_gets_them_in_the_system_message():
    tok = Words("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")
    assert not takes_tools(tok)
    out = text(render_chat(tok, [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "2+3?"}], tools=[WEATHER]))
    assert out.startswith("<system>Be brief.\n\nYou can call functions")
    assert json.dumps(WEATHER) in out and "<tool_call>" in out
    assert with_tool_prompt([], [WEATHER])[0]["role"] == "system"


def test_the_example_calculator_s_latency_is_an_option_checked_where_it_is_given(
        monkeypatch):
    from examples.tools import calc_tools

    slept: list[float] = []
    monkeypatch.setattr(calc_tools.time, "sleep", slept.append)
    monkeypatch.setattr(calc_tools, "random", random.Random(0))
    try:
        env = calc_tools.CalcTools(median_s=2.0, max_s=3.0)
        for _ in range(50):
            assert calc_tools.calculate("6 * 7") == "42"
        assert max(slept) == 3.0 and min(slept) < 2.0 < sorted(slept)[-5]
        assert env.tool_timeout_s == 10.0
        with pytest.raises(ConfigError, match=r"options\.median_s: -1 must be"):
            calc_tools.CalcTools(median_s=-1)
        with pytest.raises(ConfigError, match=r"options\.max_s: 12 must be below "
                                              r"tool_timeout_s \(10\)"):
            calc_tools.CalcTools(max_s=12)
    finally:
        calc_tools.LATENCY.update(median_s=calc_tools.MEDIAN_S, max_s=calc_tools.MAX_S)
