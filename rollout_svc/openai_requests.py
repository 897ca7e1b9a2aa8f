"""The OpenAI-compatible API's request bodies, and its refusals in OpenAI's error shape.

Bodies are strict pydantic models: a field we do not implement is refused by name rather than
silently ignored, and no value is coerced. A refusal (a body that does not validate, or an
HTTPException of a route) answers `{"error": {"message", "type", "param", "code"}}`, so an
OpenAI client shows the message naming the field. rollout_svc.openai_api serves them;
tests/integration/test_custom_rollouts.py exercises both.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from relayrl.config.rollout import MAX_SEED, MAX_TEMPERATURE
from relayrl.contracts.json_types import json_int
from rollout_svc.custom import CustomGenerator


class _Strict(BaseModel):
    # no unknown fields, no coercion (true is not 1, "1" is not 1), no NaN or infinities
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


Count = json_int(Field(ge=1))
Choices = json_int(Field(ge=1, le=64))
Seed = json_int(Field(ge=0, le=MAX_SEED))
OnlySampled = json_int(Field(ge=0, le=0))


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
    user: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: OnlySampled | None = Field(None, description="Only the sampled token's.")
    echo: Literal[False] = False


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: str | None = None
    tool_call_id: str | None = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: OnlySampled | None = None


class TokenizeRequest(_Strict):
    prompt: str
    add_special_tokens: bool = True


def sampling(gen: CustomGenerator, prompt: list[int], max_tokens, temperature, n, seed,
             ignore_eos: bool, where: str, prompt_field: str):
    """The generator's request for a body's sampling fields; ValueError names the field."""
    # OpenAI's temperature 0 means greedy
    greedy = temperature == 0
    return gen.request(token_ids=prompt, max_new_tokens=max_tokens or 0,
                       temperature=0.0 if greedy or temperature is None else temperature,
                       n=n, greedy=greedy, seed=seed or 0, ignore_eos=ignore_eos,
                       where=where, prompt_field=prompt_field)


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
    return _error(400, f"{param}: {first.get('msg', 'invalid')}{got}", param)
