"""A `verifiers` environment played as a RelayRL environment: its own rollout loop, its
rubric's reward, RelayRL's model.

    task: {source: verifiers, env_id: my_env}    # rollout.environment is set to this adapter

verifiers runs an episode as a coroutine, `env.rollout(input, client, model)`, that asks its
client for each model reply. Here that client is a bridge: each request it receives is the
conversation so far, handed to the rollout worker, which generates the reply with the policy
and hands it back through `step`. So the environment's `env_response`, stop conditions and
state are verifiers' own, unchanged, while RelayRL keeps the tokens, masks, log-probabilities
and policy versions. When the rollout ends the rubric scores it (`rubric.score_rollout`) and
that score is the episode's reward.

The coroutines of every episode in the process run on one event-loop thread. An episode
RelayRL leaves early (an error, a timeout, its token budget) has its coroutine cancelled when
the adapter is dropped. The environment's `max_turns` is held to rollout.environment.max_turns,
so both sides end an episode on the same turn.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from relayrl.plugins.envs.protocol import Environment, Step
from relayrl.plugins.tasks.problem import Problem
from relayrl_tasks.tasks.verifiers_task import load_env

_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_ids = itertools.count()


def event_loop() -> asyncio.AbstractEventLoop:
    """The process's event loop for verifiers coroutines, on a daemon thread of its own."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="verifiers-loop",
                             daemon=True).start()
        return _loop


class VerifiersEnvironment(Environment):
    """One episode of a verifiers environment (options set from the task by the config)."""

    def __init__(self, env_id: str, env_args: Mapping[str, Any] | None = None,
                 max_turns: int = 4):
        self.env = load_env(env_id, env_args or {})
        if getattr(self.env, "max_turns", 0) <= 0 or self.env.max_turns > max_turns:
            self.env.max_turns = max_turns
        self._channel = _Channel()
        self._prompt: list[dict[str, str]] = []

    def reset(self, problem: Problem) -> Sequence[Mapping[str, str]] | None:
        """Starts verifiers' rollout of the problem's row; its first request opens the
        episode."""
        row = dict(problem.metadata) or {"prompt": [dict(m) for m in problem.messages],
                                         "answer": problem.reference}
        task = asyncio.run_coroutine_threadsafe(_play(self.env, row, self._channel),
                                                event_loop())
        weakref.finalize(self, task.cancel)  # the coroutine holds the channel, not self
        kind, value = self._channel.events.get()
        if kind != "ask":
            raise _unexpected(kind, value, "before the model's first turn")
        self._prompt = value
        return value

    def step(self, message: str) -> Step:
        """Hands the model's reply to the rollout; the environment's answer is what its next
        request adds to the conversation, or, when the rollout ended, the rubric's reward."""
        reply = self._channel.reply
        assert reply is not None, "step before reset"
        event_loop().call_soon_threadsafe(reply.set_result, message)
        kind, value = self._channel.events.get()
        if kind == "done":
            return Step([], reward=value, done=True)
        if kind != "ask":
            raise _unexpected(kind, value, "after the model's reply")
        said = len(self._prompt) + 1  # the conversation so far and the model's reply
        self._prompt = value
        return Step(value[said:])


class _Channel:
    """Between an episode's coroutine and the worker's threads: the coroutine's events
    ("ask" with the conversation, "done" with the reward, "error"), and the pending reply."""

    def __init__(self) -> None:
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.reply: asyncio.Future[str] | None = None

    async def ask(self, prompt: Any) -> str:
        """The model's reply to `prompt` (verifiers' messages), from the worker's next step."""
        self.reply = asyncio.get_running_loop().create_future()
        self.events.put(("ask", [_plain(m) for m in prompt]))
        return await self.reply


async def _play(env: Any, row: dict[str, Any], channel: _Channel) -> None:
    """verifiers' rollout of `row`, scored by the environment's rubric."""
    try:
        state = await env.rollout(row, _Bridge(channel), "relayrl", {})
        await env.rubric.score_rollout(state)
        await env.rubric.cleanup(state)
        error = state.get("error")
        if error is not None:
            channel.events.put(("error", error))
        else:
            channel.events.put(("done", float(state["reward"])))
    except asyncio.CancelledError:
        channel.events.put(("error", "the episode was left"))  # wakes a waiting thread
        raise
    except Exception as err:  # the environment's or the rubric's own error
        channel.events.put(("error", err))


def _unexpected(kind: str, value: Any, when: str) -> Exception:
    if kind == "error":
        what = value if isinstance(value, str) else f"{type(value).__name__}: {value}"
        return RuntimeError(f"the verifiers rollout failed {when}: {what}")
    return RuntimeError(f"the verifiers rollout ended {when}")


def _plain(message: Any) -> dict[str, str]:
    """A verifiers message as {role, content}; content parts joined as text."""
    m = message.model_dump() if hasattr(message, "model_dump") else dict(message)
    content = m.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return {"role": str(m.get("role")), "content": content or ""}


def _bridge_class() -> type:
    """verifiers' Client with `get_response` answered by the episode (built on first use, so
    importing this module does not import verifiers)."""
    from verifiers.legacy.clients.client import Client
    from verifiers.legacy.types import Response, ResponseMessage

    class Bridge(Client):
        def __init__(self, channel: _Channel):
            super().__init__(channel)

        async def get_response(self, prompt: Any, model: str, sampling_args: Any,
                               tools: Any = None, **kwargs: Any) -> Any:
            text = await self.client.ask(prompt)
            message = ResponseMessage(content=text, finish_reason="stop", is_truncated=False)
            return Response(id=f"relayrl-{next(_ids)}", created=int(time.time()),
                            model=model, message=message)

        def setup_client(self, config: Any) -> Any:
            raise NotImplementedError

        async def to_native_tool(self, tool: Any) -> Any:
            raise NotImplementedError

        async def to_native_prompt(self, messages: Any) -> Any:
            raise NotImplementedError

        async def get_native_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        async def raise_from_native_response(self, response: Any) -> None:
            raise NotImplementedError

        async def from_native_response(self, response: Any) -> Any:
            raise NotImplementedError

        async def close(self) -> None:
            return None

    return Bridge


def _Bridge(channel: _Channel) -> Any:  # noqa: N802  (a class, built late)
    global _bridge
    if _bridge is None:
        _bridge = _bridge_class()
    return _bridge(channel)


_bridge: type | None = None
