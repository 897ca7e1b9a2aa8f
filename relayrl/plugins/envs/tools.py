"""Environments where the model calls functions: declare the tools, RelayRL does the rest.

    from relayrl.plugins.envs import ToolEnvironment

    def add(a: float, b: float) -> float:
        \"\"\"Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        \"\"\"
        return a + b

    class Arithmetic(ToolEnvironment):
        tools = [add]

Configured as `rollout.environment: {cls: mypkg.envs:Arithmetic, max_turns: 6}`; the
options below go in `rollout.environment.options`. A tool is a typed Python function with a
Google-style docstring (its JSON schema is built the way transformers' chat templates build
it), or a `Tool(schema, fn)` pairing an OpenAI-style JSON schema with the function that runs
it; functions may be `async`.

The episode opens with the task's prompt, the tools declared through the model's chat
template (relayrl.plugins.chat: in the system message when the template ignores `tools=`).
Each reply of the model is read for tool calls (Hermes/Qwen, Mistral and Llama 3 formats).
Its calls run at once on threads, at most `max_concurrent_tools` at a time in the process,
each waited for up to `tool_timeout_s`, and their results come back as `tool` messages in the
order of the calls; those tokens are the environment's, masked from the loss. A reply with no
call is the model's answer: `answer` ends the episode and the task's reward scores the reply
(override it to score differently).

A bad call never ends the episode: the model is told what went wrong in the call's `tool`
message, `error: <what>`, and the error is counted by kind (the worker's /metrics,
relayrl_env_tool_errors_total):
  malformed           the call is not JSON, has no name, or its arguments are not an object
  unknown_tool        no tool has that name
  bad_arguments       the arguments do not fit the tool's parameters
  raised              the tool raised (the message gives the exception)
  tool_timeout_s      the tool did not return in time (it goes on running on its thread)
  max_result_chars    the result was longer than allowed and is cut (the cut result is sent)
  max_calls_per_turn  the reply made more calls than allowed; the extra ones are not run
  max_stuck_tools     not run: too many earlier calls are still running past their deadlines
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from relayrl.config import ConfigError
from relayrl.plugins.chat import Schema, ToolCall, parse_tool_calls
from relayrl.plugins.envs.calls import Done, EnvCalls, Overran
from relayrl.plugins.envs.protocol import Environment, Message, Step
from relayrl.plugins.tasks.problem import Problem

TOOL_ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "raised", "tool_timeout_s",
                    "max_result_chars", "max_calls_per_turn", "max_stuck_tools")
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),)}


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its OpenAI-style JSON schema, and what runs it."""
    schema: Schema
    fn: Callable[..., Any]

    @property
    def name(self) -> str:
        """The name the model calls it by."""
        return self.schema["function"]["name"]


def as_tool(item: Any, owner: str) -> Tool:
    """A declared tool (a documented, typed function or a Tool) checked; ConfigError naming
    `owner` and the tool otherwise."""
    if isinstance(item, Tool):
        fn = item.schema.get("function") if isinstance(item.schema, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                or not callable(item.fn):
            raise ConfigError(f"{owner}.tools: {item!r} needs a schema "
                              '{"type": "function", "function": {"name": ...}} and a callable')
        return item
    if not callable(item):
        raise ConfigError(f"{owner}.tools: {item!r} is neither a function nor a Tool")
    from transformers.utils import get_json_schema

    try:
        return Tool(get_json_schema(item), item)
    except Exception as err:  # transformers raises its own types for a bad docstring
        raise ConfigError(f"{owner}.tools: {getattr(item, '__name__', item)!r}: {err} (a tool "
                          "needs type hints and a Google-style docstring with an Args "
                          "section, or a Tool(schema, fn))") from None


class ToolEnvironment(Environment):
    """An environment whose model calls the functions of `tools`. Options: `tool_timeout_s`,
    `max_concurrent_tools` (in the process), `max_result_chars` (of one result),
    `max_calls_per_turn`, `max_stuck_tools` (calls past their deadlines still running)."""

    tools: ClassVar[Sequence[Any]] = ()

    def __init__(self, tool_timeout_s: float = 10.0, max_concurrent_tools: int = 16,
                 max_result_chars: int = 8192, max_calls_per_turn: int = 8,
                 max_stuck_tools: int = 64):
        for name, value in (("tool_timeout_s", tool_timeout_s),
                            ("max_concurrent_tools", max_concurrent_tools),
                            ("max_result_chars", max_result_chars),
                            ("max_calls_per_turn", max_calls_per_turn),
                            ("max_stuck_tools", max_stuck_tools)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"rollout.environment.options.{name}: {value!r} must be a "
                                  "number above 0")
        self.tool_timeout_s = float(tool_timeout_s)
        self.max_result_chars = int(max_result_chars)
        self.max_calls_per_turn = int(max_calls_per_turn)
        self.toolbox = toolbox(type(self))
        self.runner = _runner(int(max_concurrent_tools), int(max_stuck_tools))
        self.problem: Problem | None = None
        self.calls = 0  # tool calls run (or refused) in this episode
        self.errors: Counter[str] = Counter()  # by kind (TOOL_ERROR_KINDS)

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        """The JSON schemas the chat template declares."""
        return [dict(t.schema) for t in toolbox(cls).values()]

    def take_counts(self) -> tuple[int, Counter[str]]:
        """The calls and errors counted since the last take (the worker adds them up)."""
        counts = (self.calls, self.errors)
        self.calls, self.errors = 0, Counter()
        return counts

    def reset(self, problem: Problem) -> Sequence[Message] | None:
        """Open with the task's prompt (as messages, so that the tools are declared)."""
        self.problem = problem
        return [dict(m) for m in problem.messages] or [{"role": "user", "content":
                                                         problem.text}]

    def answer(self, message: str) -> Step:
        """The model replied without a call. By default the episode ends and the task's
        reward scores `message`."""
        return Step((), None, True)

    def step(self, message: str) -> Step:
        """Run the reply's tool calls and answer each with a `tool` message; a reply without
        one is the answer."""
        reply = parse_tool_calls(message)
        if not reply.calls and not reply.malformed:
            return self.answer(message)
        answers: list[str] = [self._error("malformed", m) for m in reply.malformed]
        calls = reply.calls[:self.max_calls_per_turn]
        answers += self._run(calls)
        for call in reply.calls[self.max_calls_per_turn:]:
            answers.append(self._error("max_calls_per_turn", f"{call.name}: not run, the reply "
                                       f"made more than {self.max_calls_per_turn} calls"))
        self.calls += len(reply.calls) + len(reply.malformed)
        return Step([{"role": "tool", "content": a} for a in answers], None, False)

    def _run(self, calls: Sequence[ToolCall]) -> list[str]:
        """Each call's answer (its result, or an error), the calls running at once."""
        jobs: list[Callable[[], Any] | str] = [self._job(c) for c in calls]
        runnable = [j for j in jobs if callable(j)]
        outcomes = iter(self.runner.run_all(runnable, self.tool_timeout_s))
        answers = []
        for call, job in zip(calls, jobs, strict=True):
            answers.append(job if isinstance(job, str) else self._result(call, next(outcomes)))
        return answers

    def _job(self, call: ToolCall) -> Callable[[], Any] | str:
        """What runs `call`, or the error that stops it before it runs."""
        tool = self.toolbox.get(call.name)
        if tool is None:
            return self._error("unknown_tool", f"no tool is named {call.name!r}; the tools are "
                               f"{', '.join(sorted(self.toolbox))}")
        problem = check_arguments(tool, call.arguments)
        if problem:
            return self._error("bad_arguments", f"{call.name}: {problem}")
        if inspect.iscoroutinefunction(tool.fn):
            return lambda: asyncio.run(tool.fn(**call.arguments))
        return lambda: tool.fn(**call.arguments)

    def _result(self, call: ToolCall, outcome: Any) -> str:
        if isinstance(outcome, Overran):
            return self._error("tool_timeout_s", f"{call.name}: no result within "
                               f"{self.tool_timeout_s:g} s")
        if not isinstance(outcome, Done):  # Refused
            return self._error("max_stuck_tools", f"{call.name}: not run, {outcome.stuck} "
                               "earlier calls are still running past their deadlines")
        if outcome.error is not None:
            err = outcome.error
            return self._error("raised", f"{call.name}: {type(err).__name__}: {err}")
        text = shown(outcome.value)
        if len(text) > self.max_result_chars:
            self.errors["max_result_chars"] += 1
            return (f"{text[:self.max_result_chars]}\n[cut: the result held {len(text)} "
                    f"characters, {self.max_result_chars} are shown]")
        return text

    def _error(self, kind: str, detail: str) -> str:
        assert kind in TOOL_ERROR_KINDS, kind
        self.errors[kind] += 1
        return f"error: {detail}"


def declared_tools(env_cls: type[Environment]) -> list[dict[str, Any]] | None:
    """The tool schemas of an environment class, None when it declares none."""
    return env_cls.tool_schemas() if issubclass(env_cls, ToolEnvironment) else None


def check_deadlines(env: Environment, step_timeout_s: float) -> None:
    """Refuse tools that may run past the step that calls them: the step would be
    abandoned, ending the episode, where a late tool should only be an error to the model."""
    if isinstance(env, ToolEnvironment) and env.tool_timeout_s >= step_timeout_s:
        raise ConfigError(f"rollout.environment.options.tool_timeout_s: "
                          f"{env.tool_timeout_s:g} must be below "
                          f"rollout.environment.step_timeout_s ({step_timeout_s:g})")


def check_arguments(tool: Tool, arguments: Mapping[str, Any]) -> str:
    """Why `arguments` do not fit the tool's parameters, or ''."""
    params = tool.schema["function"].get("parameters") or {}
    props = params.get("properties") or {}
    missing = [p for p in params.get("required") or () if p not in arguments]
    if missing:
        return f"missing argument {missing[0]!r}"
    for name, value in arguments.items():
        if name not in props:
            return f"unknown argument {name!r}; the arguments are {', '.join(props) or 'none'}"
        kinds = props[name].get("type")
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or ())
        if props[name].get("nullable"):
            kinds.append("null")
        if kinds and not any(_is(value, k) for k in kinds):
            return f"argument {name!r} is {json.dumps(value)[:80]}, not {' or '.join(kinds)}"
        if "enum" in props[name] and value not in props[name]["enum"]:
            return f"argument {name!r} is {json.dumps(value)[:80]}, not one of " \
                   f"{props[name]['enum']}"
    try:
        inspect.signature(tool.fn).bind(**arguments)
    except TypeError as err:  # a parameter the schema does not describe
        return str(err)
    except ValueError:  # a callable whose signature cannot be read: the tool judges
        pass
    return ""


def _is(value: Any, kind: str) -> bool:
    types = JSON_TYPES.get(kind)
    if types is None:
        return True  # a kind JSON schema has that this check does not know: let the tool judge
    return isinstance(value, types) and not (isinstance(value, bool) and kind != "boolean")


def shown(value: Any) -> str:
    """A tool's result as the model reads it: a string as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


@functools.cache
def toolbox(cls: type[ToolEnvironment]) -> dict[str, Tool]:
    """The class's tools by name, checked once per class."""
    owner = cls.__name__
    tools = [as_tool(t, owner) for t in cls.tools]
    if not tools:
        raise ConfigError(f"{owner}.tools: declare at least one tool")
    named: dict[str, Tool] = {}
    for t in tools:
        if t.name in named:
            raise ConfigError(f"{owner}.tools: two tools are named {t.name!r}")
        named[t.name] = t
    return named


class _Runner:
    """Tool calls on threads with deadlines (EnvCalls), at most `max_concurrent` at once."""

    def __init__(self, max_concurrent: int, max_stuck: int):
        self.calls = EnvCalls(max_stuck, "rollout.environment.options.max_stuck_tools")
        self.slots = threading.BoundedSemaphore(max_concurrent)

    def run_all(self, fns: Sequence[Callable[[], Any]], timeout_s: float) -> list[Any]:
        deadline = time.monotonic() + timeout_s

        def guarded(fn: Callable[[], Any]) -> Callable[[], Any]:
            def call() -> Any:
                if not self.slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    raise TimeoutError("no free slot before the deadline")  # read by nobody
                try:
                    return fn()
                finally:
                    self.slots.release()
            return call

        return self.calls.call_all([guarded(fn) for fn in fns], timeout_s)


_RUNNERS: dict[tuple[int, int], _Runner] = {}
_RUNNERS_LOCK = threading.Lock()


def _runner(max_concurrent: int, max_stuck: int) -> _Runner:
    """The process's runner for these limits: the limits hold across all episodes."""
    with _RUNNERS_LOCK:
        key = (max_concurrent, max_stuck)
        if key not in _RUNNERS:
            _RUNNERS[key] = _Runner(max_concurrent, max_stuck)
        return _RUNNERS[key]
