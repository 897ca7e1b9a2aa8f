"""A chat model's conversation format with tools: rendering tool declarations through its
chat template, and reading the tool calls out of what it writes.

    ids = render_chat(tokenizer, messages, tools=[schema, ...])   # the prompt's token ids
    ids = encode_problem(tokenizer, text, messages)  # a task's prompt, template or not
    reply = parse_tool_calls(text)        # reply.content, reply.calls, reply.malformed

Tools are OpenAI-style JSON schemas (`{"type": "function", "function": {"name",
"description", "parameters"}}`), what transformers' chat templates take as `tools=`. A
template that renders them (Qwen2.5/3, Llama 3.1+, Mistral, Hermes) gets them as they are. A
template that ignores them (SmolLM2's, for one) would leave the model blind to its tools, so
they are described in the system message instead, in the Hermes format: the schemas inside
`<tools></tools>` and each call written as `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`.

Calls are read in the formats of the template families: Hermes/Qwen `<tool_call>` tags, a
Mistral `[TOOL_CALLS]` list, and Llama 3's bare JSON object (`{"name", "parameters"}`,
after an optional `<|python_tag|>`). Special tokens are usually decoded away, so each
format is recognised by its text as well. A call that is there but does not parse is
returned in `malformed` with the reason, never dropped silently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

Schema = Mapping[str, Any]  # {"type": "function", "function": {"name", "description", ...}}

HERMES_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
MISTRAL_MARK = "[TOOL_CALLS]"
LLAMA_MARK = "<|python_tag|>"
TOOL_PROMPT = (
    "You can call functions to help you answer. Their signatures, as JSON schemas, are inside "
    "<tools></tools>:\n<tools>\n{schemas}\n</tools>\n"
    "To call a function, write a JSON object with its name and arguments inside "
    "<tool_call></tool_call> tags, one per call:\n"
    '<tool_call>\n{{"name": "<function-name>", "arguments": {{<arguments>}}}}\n</tool_call>\n'
    "Each result comes back in a message of its own. When you have the answer, reply "
    "without a call.")


class ToolCall(NamedTuple):
    """A call the model wrote: the function's name and its arguments, parsed."""
    name: str
    arguments: dict[str, Any]


class Reply(NamedTuple):
    """What a model's reply holds: its text outside any call, the calls, and the calls that
    could not be read (each a reason naming what is wrong)."""
    content: str
    calls: list[ToolCall]
    malformed: list[str]


def takes_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders `tools=` itself."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return "tools" in template


def tool_prompt(tools: Sequence[Schema]) -> str:
    """The system text that describes `tools` to a model whose template does not."""
    return TOOL_PROMPT.format(schemas="\n".join(json.dumps(t) for t in tools))


def with_tool_prompt(messages: Sequence[Mapping[str, Any]], tools: Sequence[Schema]
                     ) -> list[dict[str, Any]]:
    """`messages` with the tools described in their system message (one is added first
    when there is none)."""
    out = [dict(m) for m in messages]
    text = tool_prompt(tools)
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0].get('content') or ''}\n\n{text}"
    else:
        out.insert(0, {"role": "system", "content": text})
    return out


def hermes_text(calls: Sequence[ToolCall]) -> str:
    """Calls written in the Hermes format that `tool_prompt` teaches."""
    return "\n".join(f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.arguments})}"
                     "\n</tool_call>" for c in calls)


def render_chat(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *,
                tools: Sequence[Schema] | None = None,
                generation_prompt: bool = True) -> list[int]:
    """The conversation's token ids under the model's chat template (ending with the
    assistant's opening when `generation_prompt`), with `tools` declared as the template
    takes them or, when it ignores them, in the system message."""
    messages = [dict(m) for m in messages]
    if tools and not takes_tools(tokenizer):
        messages, tools = with_tool_prompt(messages, tools), None
    ids = tokenizer.apply_chat_template(messages, tools=list(tools) if tools else None,
                                        add_generation_prompt=generation_prompt,
                                        tokenize=True, return_dict=False)
    return [int(i) for i in ids]


def parse_tool_calls(text: str) -> Reply:
    """The tool calls in a model's reply, in any of the formats above."""
    if "<tool_call>" in text:
        calls, malformed = [], []
        for body in HERMES_CALL.findall(text):
            _read(body, calls, malformed)
        content = HERMES_CALL.sub("", text).strip()
        return Reply(content, calls, malformed)
    for mark in (MISTRAL_MARK, LLAMA_MARK):
        if mark in text:
            content, _, body = text.partition(mark)
            calls, malformed = [], []
            _read(body, calls, malformed)
            return Reply(content.strip(), calls, malformed)
    stripped = text.strip()
    if stripped.startswith(("{", "[")) and '"name"' in stripped:  # Llama 3 / Mistral, bare
        calls, malformed = [], []
        _read(stripped, calls, malformed)
        if calls:
            return Reply("", calls, malformed)
    return Reply(text, [], [])


def _read(body: str, calls: list[ToolCall], malformed: list[str]) -> None:
    """Append the call (or list of calls) JSON `body` holds, or the reason it does not."""
    try:
        value = json.loads(body.strip())
    except ValueError as err:
        malformed.append(f"the call is not JSON ({err}): {_cut(body)}")
        return
    for item in value if isinstance(value, list) else [value]:
        call = as_call(item)
        if isinstance(call, str):
            malformed.append(call)
        else:
            calls.append(call)


def as_call(item: Any) -> ToolCall | str:
    """A parsed call object as a ToolCall, or the reason it is not one. Arguments may be
    an object or a JSON string of one (OpenAI's form); `parameters` is Llama 3's name."""
    if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) \
            or not item["name"]:
        return f"a call must be an object with a string \"name\": {_cut(json.dumps(item))}"
    args = item.get("arguments", item.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return f"{item['name']}: the arguments are not JSON: {_cut(args)}"
    if not isinstance(args, Mapping):
        return f"{item['name']}: the arguments must be an object, not {type(args).__name__}"
    return ToolCall(item["name"], dict(args))


def _cut(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Plain text as the model reads it: its beginning-of-sequence token, then the text."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    bos = tokenizer.bos_token_id
    return ([bos] if bos is not None else []) + list(ids)


def encode_chat(tokenizer: Any, messages: list[dict], tools: Sequence[Schema] | None = None
                ) -> list[int]:
    """A conversation as the model's chat template lays it out (with `tools` declared,
    above), ending with the assistant's turn; a model with no template gets
    the contents joined."""
    if getattr(tokenizer, "chat_template", None):
        return render_chat(tokenizer, messages, tools=tools)
    if tools:
        messages = with_tool_prompt(messages, tools)
    return encode_text(tokenizer, "".join(m.get("content") or "" for m in messages))


def encode_problem(tokenizer: Any, text: str, messages: Sequence[Mapping[str, str]] = ()
                   ) -> list[int]:
    """A task's prompt: chat messages through the chat template, else raw text."""
    if messages:
        return encode_chat(tokenizer, [dict(m) for m in messages])
    return encode_text(tokenizer, text)
