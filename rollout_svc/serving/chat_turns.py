"""A conversation sent back to the OpenAI-compatible server, rendered as the tokens the model
actually wrote, so that an agent's turn N+1 prompt extends turn N's prompt and completion
exactly and the whole episode can be trained as one sequence.

An agent sends back the assistant message the server returned (its content, its tool calls
with their ids); re-rendering it through the chat template need not give back the model's
tokens (a call's JSON is re-spaced, a text re-tokenized differently). So the server
remembers each assistant turn it returned, keyed by the context it continued and the
message it gave, and renders a conversation turn by turn: the template's tokens up to an
assistant turn, that turn's own tokens, then the template's tokens between it and the next
(relayrl_tasks.episodes.turns.TurnGlue, the rule the worker's own episodes follow).
Assistant turns before the first one the server remembers are the agent's own (worked
examples in a few-shot prompt) and are rendered by the template, as they were in the first
turn's prompt. A conversation with an assistant turn the server does not remember after one
it does (edited by the agent, or forgotten for its quota) is rendered whole by the template
instead: still a valid prompt, but not an extension of the earlier turns' tokens (a tagged
episode refuses it, rollout_svc.serving.agent_episodes).

Each agent credential has a TurnMemory of its own (TurnMemories, keyed by a hash of the
bearer token, never the token), of rollout.turn_memory_per_agent turns: one agent's traffic
evicts only its own turns.

    memory = TurnMemories(per_agent=4096).of(authorization)
    ids = memory.render(glue, messages)          # the prompt's token ids
    memory.remember(ids, message, tokens, stopped)
"""

from __future__ import annotations

import hashlib
import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from relayrl.plugins.chat import ToolCall, hermes_text
from relayrl_tasks.episodes.turns import TurnGlue


def key(context: Sequence[int], message: Mapping[str, Any]) -> str:
    """What identifies an assistant turn: the context it continued and what it said."""
    calls = [c.get("id") for c in message.get("tool_calls") or ()]
    h = hashlib.sha256(array("i", context).tobytes())
    h.update(json.dumps([message.get("content") or "", calls]).encode())
    return h.hexdigest()


def as_text(message: Mapping[str, Any]) -> str:
    """An assistant message as text: its content, then its calls in the Hermes format."""
    calls = [ToolCall(c["function"]["name"], c["function"]["arguments"])
             for c in message.get("tool_calls") or ()]
    return (message.get("content") or "") + (hermes_text(calls) if calls else "")


def credential_key(authorization: str | None) -> str:
    """What tells callers apart: a hash of their Authorization header, never the token."""
    return hashlib.sha256((authorization or "").encode("utf-8", "replace")).hexdigest()


class TurnMemory:
    """The assistant turns the server returned to one agent, oldest forgotten first."""

    def __init__(self, max_turns: int):
        self.max_turns = max_turns
        self._turns: OrderedDict[str, tuple[array, bool, str]] = OrderedDict()
        self._lock = threading.Lock()
        self.recalled = 0  # assistant turns rendered as their own tokens
        self.rerendered = 0  # conversations rendered whole: a turn was not remembered
        self.evicted = 0  # turns forgotten for the quota

    def remember(self, context: Sequence[int], message: Mapping[str, Any],
                 tokens: Sequence[int], stopped: bool, text: str) -> None:
        """`message` (as returned) continued `context` with `tokens`, which decode to
        `text`; `stopped`: they end with the model's end of turn."""
        with self._lock:
            self._turns[key(context, message)] = (array("i", tokens), stopped, text)
            while len(self._turns) > self.max_turns:
                self._turns.popitem(last=False)
                self.evicted += 1

    def _recall(self, context: Sequence[int], message: Mapping[str, Any]):
        with self._lock:
            return self._turns.get(key(context, message))

    def render(self, glue: TurnGlue, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The conversation's prompt: every assistant turn from the first one remembered on
        as its own tokens when each is remembered, else the template's rendering of the
        whole."""
        said = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if said and said[-1] == len(messages) - 1:  # ends with the assistant: a prefill
            return glue.prompt(messages)
        plain = [m if m["role"] != "assistant" else {"role": "assistant",
                                                     "content": as_text(m)} for m in messages]
        context: list[int] | None = None  # through the last turn recalled
        recalled = 0
        for n, i in enumerate(said):
            if context is None:  # none recalled yet: this turn may be the agent's own
                turn = self._recall(first := glue.prompt(plain[:i]), messages[i])
                if turn is None:  # written by the agent (a worked example): the prompt's
                    continue
                context = first
            else:
                turn = self._recall(context, messages[i])
                if turn is None:
                    self.rerendered += 1
                    return glue.prompt(plain)
            tokens, stopped, text = turn
            nxt = said[n + 1] if n + 1 < len(said) else len(messages)
            context = context + tokens.tolist() + glue.between(
                plain[:i], text, stopped, [dict(m) for m in plain[i + 1:nxt]])
            recalled += 1
        self.recalled += recalled
        return glue.prompt(plain) if context is None else context


class TurnMemories:
    """A TurnMemory per agent credential, each of `per_agent` turns. Only a server that
    checks tokens tells callers apart (there are as many memories as tokens it accepts);
    without auth every caller is one agent."""

    def __init__(self, per_agent: int):
        self.per_agent = per_agent
        self._memories: dict[str, TurnMemory] = {}
        self._lock = threading.Lock()

    def of(self, authorization: str | None) -> TurnMemory:
        """The memory of the caller whose `authorization` header this is (None: the one
        memory of a server without auth)."""
        who = credential_key(authorization)
        with self._lock:
            memory = self._memories.get(who)
            if memory is None:
                memory = self._memories[who] = TurnMemory(self.per_agent)
            return memory

    @property
    def evicted(self) -> int:
        """Turns forgotten for a quota, over every agent."""
        with self._lock:
            return sum(m.evicted for m in self._memories.values())
