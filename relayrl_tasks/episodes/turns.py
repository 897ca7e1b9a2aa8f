"""The tokens between two assistant turns, so that turn N+1's context extends turn N's exactly.

A multi-turn sample is one token sequence: the prompt, then the model's tokens of turn 1 as
sampled, then the tokens the chat template puts around the environment's reply (closing the
assistant turn, the reply's own turns, opening the next assistant turn), then turn 2's
tokens, and so on. Re-tokenizing the whole conversation each turn would not do: the model's
tokens need not be what the tokenizer makes of their text, and their log-probabilities would
no longer line up. So the sequence only ever grows: each turn's glue is the *difference*
between the template's rendering of the conversation with and without the new messages,
checked to extend it exactly (ValueError when a template rewrites earlier turns).

    glue = TurnGlue(tokenizer, eos_ids, tools)           # tools: the environment's schemas
    glue.prompt(messages)                                 # the first context
    glue.between(messages, reply, stopped, observation)   # masked tokens to append

The closing of the assistant turn: when the model produced the end-of-turn token itself
(`stopped`) it is kept as the model's and the template's copy is left out; when the turn
was cut, the template's closing tokens are appended as environment tokens. A tokenizer with
no chat template lays messages end to end (relayrl.plugins.chat.encode_chat). Every
rendering declares the environment's tools (relayrl.plugins.chat.render_chat).

Renderings are remembered (the latest, up to RENDERED_TOKENS tokens in all): a turn's
opening is the previous turn's closing rendering, and a group's episodes share theirs until
their replies differ, so about half of a step's renderings are not redone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from relayrl.plugins.chat import Schema, encode_text, render_chat, with_tool_prompt

Message = Mapping[str, str]
PROBE = ({"role": "user", "content": "1+1"},)
RENDERED_TOKENS = 1 << 20  # tokens of remembered renderings, at most (a few MB)


class TurnGlue:
    """The tokens between two assistant turns, from the model's chat template."""
    def __init__(self, tokenizer: Any, eos_ids: Sequence[int],
                 tools: Sequence[Schema] | None = None):
        self.tokenizer = tokenizer
        self.tools = list(tools or ())
        self.eos_ids = frozenset(eos_ids)
        self.templated = bool(getattr(tokenizer, "chat_template", None))
        self._rendered: dict[tuple[Any, ...], list[int]] = {}  # oldest first
        self._held = 0  # tokens in _rendered

    def render(self, messages: Sequence[Message], generation_prompt: bool) -> list[int]:
        """The token ids of `messages` under the chat template (with the assistant's
        generation prompt when asked), remembered for the next call with the same messages."""
        key = (generation_prompt, *((m["role"], m["content"]) for m in messages))
        ids = self._rendered.get(key)
        if ids is None:
            ids = self._render([dict(m) for m in messages], generation_prompt)
            self._rendered[key] = ids
            self._held += len(ids)
            while self._held > RENDERED_TOKENS:
                self._held -= len(self._rendered.pop(next(iter(self._rendered))))
        return list(ids)

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> list[int]:
        if self.templated:
            return render_chat(self.tokenizer, messages, tools=self.tools,
                               generation_prompt=generation_prompt)
        if self.tools:
            messages = with_tool_prompt(messages, self.tools)
        return encode_text(self.tokenizer, "".join(m["content"] for m in messages))

    def prompt(self, messages: Sequence[Message]) -> list[int]:
        """The context that opens an episode: the conversation, then the assistant's turn."""
        return self.render(messages, True)

    def closing(self, messages: Sequence[Message], stopped: bool) -> list[int]:
        """What the template puts after an assistant reply's text (e.g. `<|im_end|>\\n`),
        less the end-of-turn token when the model produced it (`stopped`)."""
        opened = self.render(messages, True)
        closed = self.render([*messages, {"role": "assistant", "content": ""}], False)
        tail = extension(opened, closed, "closing an assistant turn")
        if stopped and tail and tail[0] in self.eos_ids:
            return tail[1:]
        return tail

    def between(self, messages: Sequence[Message], reply: str, stopped: bool,
                observation: Sequence[Message]) -> list[int]:
        """The tokens to append after the model's reply to `messages` so that the context
        ends where the template opens the assistant's next turn after `observation`."""
        said = [*messages, {"role": "assistant", "content": reply}]
        before = self.render(said, False)
        after = self.render([*said, *observation], True)
        return self.closing(messages, stopped) + extension(before, after, "an observation")

    def check(self) -> None:
        """Refuse, at start-up, a template that rewrites earlier turns when one is added."""
        self.between(PROBE, "2", True, [{"role": "user", "content": "3"}])


def extension(prefix: list[int], full: list[int], what: str) -> list[int]:
    """`full` less `prefix`, which it must start with."""
    if full[:len(prefix)] != prefix:
        at = next((i for i, (a, b) in enumerate(zip(prefix, full, strict=False)) if a != b),
                  min(len(prefix), len(full)))
        raise ValueError(f"chat template: rendering {what} changes the tokens before it (first "
                         f"difference at token {at}); multi-turn episodes need a template "
                         "that only appends")
    return full[len(prefix):]
