"""The OpenAI-compatible API's request bodies, and its refusals in OpenAI's error shape.

Bodies are strict pydantic models: a field we do not implement is refused by name rather than
silently ignored, and no value is coerced. A refusal (a body that does not validate, or an
HTTPException of a route) answers `{"error": {"message", "type", "param", "code"}}`, so an
OpenAI client shows the message naming the field. rollout_svc.serving.openai_server serves them;
tests/integration/test_custom_rollouts.py exercises both.

On the vllm engine a body is parsed by vLLM's own request models first (`vllm_parsed`), so it
is accepted with the meaning vLLM's server gives it: what vLLM refuses is refused with vLLM's
reason, a field vLLM has but RelayRL does not carry is accepted only at a value that changes
nothing (its default, or top_p 1 and the like), and a field vLLM would silently ignore is
refused by name. The body then meets the models here, which hold RelayRL's bounds.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from relayrl.config.rollout import MAX_SEED, MAX_TEMPERATURE
from relayrl.contracts.json_types import json_int
from rollout_svc.engines import stop_strings
from rollout_svc.engines.api import MAX_TOP_LOGPROBS
from rollout_svc.serving.generator import CustomGenerator


class _Strict(BaseModel):
    # no unknown fields, no coercion (true is not 1, "1" is not 1), no NaN or infinities
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


Count = json_int(Field(ge=1))
Choices = json_int(Field(ge=1, le=64))
Seed = json_int(Field(ge=0, le=MAX_SEED))
TopLogprobs = json_int(Field(ge=0, le=MAX_TOP_LOGPROBS))
MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512  # OpenAI's


class StreamOptions(_Strict):
    include_usage: bool = Field(False, description="A last chunk with the request's usage "
                                "(and no choices); every other chunk has usage null.")


class _Sampling(_Strict):
    """What completions and chat requests share."""
    model: str
    max_tokens: Count | None = None
    temperature: float | None = Field(
        None, ge=0, le=MAX_TEMPERATURE,
        description="0 samples greedily; otherwise at least 0.01 (rollout.MIN_TEMPERATURE).")
    n: Choices = 1
    seed: Seed | None = None
    ignore_eos: bool = Field(False, description="Generate max_tokens even past the end of "
                             "sequence (as vLLM's extra parameter; for benchmarks).")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    stop: str | list[str] | None = Field(None, description=(
        f"Up to {stop_strings.MAX_STOP_STRINGS} strings of 1..{stop_strings.MAX_STOP_CHARS} "
        "characters: a sequence ends at the token whose text completes one (its last token "
        "id), and its text ends before it, as vLLM's include_stop_str_in_output false."))
    metadata: dict[str, str] | None = Field(None, description=(
        f"At most {MAX_METADATA_KEYS} keys of up to {MAX_METADATA_KEY_CHARS} characters, "
        f"values of up to {MAX_METADATA_VALUE_CHARS}; not used in sampling. relayrl_episode and "
        "relayrl_task tag a recorded episode as the X-RelayRL-Episode and X-RelayRL-Task "
        "headers do."))

    @model_validator(mode="after")
    def _shared(self) -> _Sampling:
        if self.stop is not None:
            stop_strings.check(self.stop)
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only with stream true")
        meta = self.metadata or {}
        if len(meta) > MAX_METADATA_KEYS:
            raise ValueError(f"metadata: {len(meta)} keys, more than {MAX_METADATA_KEYS}")
        for k, v in meta.items():
            if len(k) > MAX_METADATA_KEY_CHARS:
                raise ValueError(f"metadata: key {_shown(k)} has {len(k)} characters, more "
                                 f"than {MAX_METADATA_KEY_CHARS}")
            if len(v) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(f"metadata: the value of {_shown(k)} has {len(v)} "
                                 f"characters, more than {MAX_METADATA_VALUE_CHARS}")
        return self

    @property
    def stops(self) -> tuple[str, ...]:
        return () if self.stop is None else stop_strings.check(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: TopLogprobs | None = Field(None, description=(
        f"The sampled token's logprob, and 1..{MAX_TOP_LOGPROBS}: that many most likely "
        "tokens' at each position too."))
    echo: Literal[False] = False


# "tool_choice: ...", "stop.3: ...", from a model check
FIELD_FIRST = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)*): ")
MAX_TOOLS = 128  # declared in one request
FunctionName = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")


class FunctionCall(_Strict):
    name: str = FunctionName
    arguments: str = Field(description="The arguments, a JSON object as a string.")

    @model_validator(mode="after")
    def _arguments(self) -> FunctionCall:
        try:
            parsed = json.loads(self.arguments)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise ValueError("arguments: not a JSON object")
        return self


class ToolCallIn(_Strict):
    """A call an assistant message made, as the response gave it."""
    id: str = Field(min_length=1, max_length=128)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = Field(None, description="None only in an assistant message that "
                                "made tool calls. A list of text parts "
                                "([{\"type\": \"text\", \"text\": ...}]) is joined with "
                                "newlines, as vLLM joins them; other parts are refused.")
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCallIn] | None = Field(None, max_length=MAX_TOOLS)

    @model_validator(mode="before")
    @classmethod
    def _parts(cls, data: Any) -> Any:
        """Content given as parts, as their text."""
        if isinstance(data, dict) and isinstance(data.get("content"), list):
            return {**data, "content": "\n".join(_text_parts(data["content"]))}
        return data

    @model_validator(mode="after")
    def _content(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"tool_calls: only an assistant message makes calls, not a "
                             f"{self.role} message")
        if self.content is None and not self.tool_calls:
            raise ValueError("content: a message needs content (or, from the assistant, "
                             "tool_calls)")
        return self


def _text_parts(parts: list[Any]) -> list[str]:
    """The texts of a message's content parts; ValueError naming the part that is not text
    (the model takes text only)."""
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict):
            raise ValueError(f"content.{j}: a content part is an object, got {_shown(part)}")
        kind = part.get("type")
        if kind != "text":
            if not isinstance(kind, str):
                raise ValueError(f"content.{j}.type: must be 'text', got {_shown(kind)}")
            raise ValueError(f"content.{j}.type: {kind!r} is not supported: this model takes "
                             "text")
        extra = sorted(set(part) - {"type", "text"})
        if extra:
            raise ValueError(f"content.{j}.{extra[0]}: not a field of a text part")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"content.{j}.text: must be a string, got "
                             f"{_shown(part.get('text'))}")
        texts.append(part["text"])
    if not texts:
        raise ValueError("content: an empty list of parts")
    return texts


class JsonSchemaFormat(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema", description="A JSON schema object.")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema: given with type 'json_schema', and only then")
        return self


class FunctionSpec(_Strict):
    name: str = FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="A JSON schema object.")
    strict: bool | None = None


class ToolSpec(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = Field(None, description=(
        f"1..{MAX_TOP_LOGPROBS}: each position's that many most likely tokens (needs "
        "logprobs true)."))
    response_format: ResponseFormat | None = Field(None, description=(
        "{'type': 'text'} (the default); json_object and json_schema constrain the reply "
        "through the vllm engine's structured outputs (refused on the torch engine, and "
        "with stream)."))
    tools: list[ToolSpec] | None = Field(None, max_length=MAX_TOOLS, description=(
        "Functions the model may call, rendered through its chat template; its calls come "
        "back as the message's tool_calls."))
    tool_choice: str | dict[str, Any] | None = Field(None, description=(
        "'auto' (the default with tools) or 'none'; 'required' or a named function "
        "({'type': 'function', 'function': {'name': ...}}) force a call through the vllm "
        "engine's structured outputs, as vLLM's server does (refused on the torch engine)."))
    parallel_tool_calls: bool = Field(True, description="False: only the first call.")

    @model_validator(mode="after")
    def _tools(self) -> ChatRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs true")
        choice = self.tool_choice
        if choice is not None and choice not in ("auto", "none", "required") and (
                self.forced_function is None):
            raise ValueError(f"tool_choice: {_shown(choice)} is not supported: 'auto', "
                             "'none', 'required' or {'type': 'function', 'function': "
                             "{'name': ...}} are")
        names = [t.function.name for t in self.tools or ()]
        if self.forces_call:
            if not self.tools:
                raise ValueError(f"tool_choice: {_shown(choice)} needs tools")
            named = self.forced_function
            if named is not None and named not in names:
                raise ValueError(f"tool_choice: function {named!r} is not among tools")
            fmt = self.response_format
            if fmt is not None and fmt.type != "text":
                raise ValueError("response_format: JSON output and a forced tool_choice "
                                 "constrain the same reply; send one of them")
        if self.structured and self.stream:
            raise ValueError("stream: constrained output (a JSON response_format, a forced "
                             "tool_choice) is returned only without streaming; send stream "
                             "false")
        if len(set(names)) != len(names):
            raise ValueError("tools: two functions have the same name")
        return self

    @property
    def forced_function(self) -> str | None:
        """The function a named tool_choice forces ({'type': 'function', 'function':
        {'name': ...}})."""
        choice = self.tool_choice
        if (isinstance(choice, dict) and set(choice) == {"type", "function"}
                and choice["type"] == "function" and isinstance(choice["function"], dict)
                and set(choice["function"]) == {"name"}
                and isinstance(choice["function"]["name"], str)):
            return choice["function"]["name"]
        return None

    @property
    def forces_call(self) -> bool:
        return self.tool_choice == "required" or self.forced_function is not None

    @property
    def forced_schema(self) -> dict[str, Any]:
        """The JSON schema of a forced call's reply, as vLLM's server builds it
        (vllm/tool_parsers/utils.py get_json_schema_from_tools): a named function's
        arguments; for 'required', a list of {name, parameters}, at least one (one only
        with parallel_tool_calls false)."""
        params = {t.function.name: t.function.parameters or {"type": "object",
                                                            "properties": {}}
                  for t in self.tools or ()}
        named = self.forced_function
        if named is not None:
            return params[named]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {
            "type": "object", "anyOf": [{
                "properties": {"name": {"type": "string", "enum": [name]},
                               "parameters": p},
                "required": ["name", "parameters"]} for name, p in params.items()]}}
        if not self.parallel_tool_calls:
            schema["maxItems"] = 1
        return schema

    @property
    def structured_what(self) -> str:
        """What asks for constrained output, as a refusal names it."""
        if self.forces_call:
            return f"tool_choice: {_shown(self.tool_choice)}"
        return f"response_format: {self.response_format.type if self.response_format else ''}"

    @property
    def structured(self) -> str:
        """The response_format (or a forced tool_choice) as the engine's
        SamplingSpec.structured ("" for none)."""
        if self.forces_call:
            return json.dumps({"json": self.forced_schema})
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return ""
        if fmt.json_schema is None:
            return json.dumps({"json_object": True})
        return json.dumps({"json": fmt.json_schema.schema_})

    @property
    def calls_tools(self) -> bool:
        """Whether the response is read for tool calls."""
        return bool(self.tools) and self.tool_choice != "none"


# A field of vLLM's request models that RelayRL does not carry is accepted at its default or at
# one of these values, each of which samples exactly as leaving it out does.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "top_p": (1, 1.0), "top_k": (0, -1), "min_p": (0, 0.0), "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0), "repetition_penalty": (1, 1.0), "logit_bias": ({},),
    "length_penalty": (1, 1.0), "min_tokens": (0,), "stop_token_ids": ([], None),
    "bad_words": ([], None), "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,), "spaces_between_special_tokens": (True,),
    "add_generation_prompt": (True,), "echo": (False,), "use_beam_search": (False,),
    "priority": (0,)}
# why a worker for training samples from the whole distribution: the trainer scores each token
# under the policy at the request's temperature, so a truncated or penalised sample's
# log-probabilities would not be the policy's
RESHAPES = frozenset({"top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                      "repetition_penalty", "logit_bias", "length_penalty", "bad_words",
                      "allowed_token_ids", "use_beam_search", "min_tokens"})
OWN_FIELDS = frozenset({"metadata"})  # RelayRL's, which vLLM's models do not declare
_BACKTICKED = re.compile(r"`([a-z_]+)`")


def _vllm_check(theirs: type[BaseModel], ours: type[BaseModel],
                data: dict[str, Any]) -> dict[str, Any]:
    """`data` parsed by vLLM's request model `theirs`: ValueError with vLLM's reason, or naming
    a field vLLM would ignore or one `ours` does not carry; else the body without the fields
    set to a value that changes nothing."""
    from pydantic import ValidationError
    from vllm.exceptions import VLLMValidationError

    model = theirs.__name__
    try:
        parsed = theirs.model_validate(copy.deepcopy(data))
    except VLLMValidationError as exc:  # raised past pydantic by some of vLLM's checks
        reason = exc.args[0] if exc.args else str(exc)
        raise ValueError(f"{exc.parameter or 'body'}: refused by vLLM's {model}: "
                         f"{reason}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        reason = first.get("msg", "invalid").removeprefix("Value error, ")
        loc = []  # up to where vLLM's unions name their members ("messages.0.Chat...Param")
        for part in map(str, first.get("loc", ())):
            if not re.fullmatch(r"[a-z0-9_]+", part):
                break
            loc.append(part)
        named = ".".join(loc) or next(iter(_BACKTICKED.findall(reason)), "body")
        raise ValueError(f"{named}: refused by vLLM's {model}: {reason}") from None
    ignored = sorted(set(parsed.model_extra or ()) - OWN_FIELDS)
    if ignored:
        raise ValueError(f"{ignored[0]}: not a field of vLLM's {model}, which would ignore "
                         "it; leave it out")
    kept = dict(data)
    for name in sorted(parsed.model_fields_set - set(ours.model_fields)):
        key = theirs.model_fields[name].alias or name
        value = data.get(key, data.get(name))
        default = theirs.model_fields[name].get_default(call_default_factory=True)
        neutral = (*NEUTRAL.get(name, ()), default)
        if any(value == v and type(value) is type(v) for v in neutral):
            kept.pop(key, None)
            kept.pop(name, None)
            continue
        why = ("it reshapes the distribution sampled from, and the trainer scores tokens "
               "under the policy's own" if name in RESHAPES else
               "this worker does not implement it")
        raise ValueError(f"{name}: {_shown(value)} is a field of vLLM's {model}, but {why}; "
                         f"leave it out or send {_shown(neutral[0])}, which changes nothing")
    return kept


@functools.cache
def vllm_parsed(ours: type[_Sampling]) -> type[_Sampling]:
    """`ours` (ChatRequest or CompletionRequest) checked first by vLLM's model of the same
    request (importing vLLM's protocol modules: seconds, done once per process)."""
    if ours is ChatRequest:
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionRequest as theirs,
        )
    else:
        assert ours is CompletionRequest, ours
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest as theirs

    class Parsed(ours):  # type: ignore[valid-type, misc]
        @model_validator(mode="before")
        @classmethod
        def _vllm(cls, data: Any) -> Any:
            return _vllm_check(theirs, ours, data) if isinstance(data, dict) else data

    Parsed.__name__ = Parsed.__qualname__ = ours.__name__
    return Parsed


def taking(route, body: type[BaseModel]):
    """`route` as FastAPI sees it with its `body` parameter of type `body`."""
    sig = inspect.signature(route, eval_str=True)

    @functools.wraps(route)
    def call(*args, **kwargs):
        return route(*args, **kwargs)

    call.__signature__ = sig.replace(parameters=[
        p.replace(annotation=body) if p.name == "body" else p for p in sig.parameters.values()])
    return call


class EpisodeReward(_Strict):
    """The reward of an episode the server recorded (rollout_svc.serving.agent_episodes)."""
    reward: float = Field(description="Finite, within the task's task.reward_range.")


class TokenizeRequest(_Strict):
    prompt: str
    add_special_tokens: bool = True


def sampling(gen: CustomGenerator, prompt: list[int], max_tokens, temperature, n, seed,
             ignore_eos: bool, where: str, prompt_field: str, stop: tuple[str, ...] = (),
             top_logprobs: int = 0, top_logprobs_field: str = "top_logprobs",
             structured: str = "", structured_what: str = ""):
    """The generator's request for a body's sampling fields; ValueError names the field."""
    # OpenAI's temperature 0 means greedy
    greedy = temperature == 0
    return gen.request(token_ids=prompt, max_new_tokens=max_tokens or 0,
                       temperature=0.0 if greedy or temperature is None else temperature,
                       n=n, greedy=greedy, seed=seed or 0, ignore_eos=ignore_eos,
                       where=where, prompt_field=prompt_field, stop=stop,
                       top_logprobs=top_logprobs, top_logprobs_field=top_logprobs_field,
                       structured=structured, structured_what=structured_what)


def error_body(message: str, param: str | None = None, status: int = 400) -> bytes:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": param,
                                 "code": None}}).encode()


def _error(status: int, message: str, param: str | None = None):
    from fastapi.responses import Response

    return Response(error_body(message, param, status), status_code=status,
                    media_type="application/json")


def _shown(value) -> str:
    """A value sent, as a refusal quotes it (NaN and infinities included), cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def http_error(request, exc):
    """FastAPI's handler of a route's HTTPException."""
    return _error(exc.status_code, str(exc.detail))


def invalid_body(request, exc):
    """FastAPI's handler of a RequestValidationError: the first problem, named by its field."""
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first.get("loc", ())[1:]) or "body"
    got = f", got {_shown(first['input'])}" if "input" in first else ""
    message = first.get("msg", "invalid").removeprefix("Value error, ")
    named = FIELD_FIRST.match(message)
    if named:  # a check across fields names its own field first
        field, message = named.group(1), message[named.end():]
        param, got = (f"{param}.{field}" if param != "body" else field), ""
    return _error(400, f"{param}: {message}{got}", param)
