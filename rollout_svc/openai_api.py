"""An OpenAI-compatible HTTP server on a rollout worker, for agents that run their own
episodes: /v1/completions, /v1/chat/completions, /v1/models and /tokenize.

Responses follow OpenAI's shapes, plus what RL needs and OpenAI does not give: each choice's
`token_ids` and `policy_versions`, the response's `prompt_token_ids` and `policy_version`.
Fields we do not implement are refused by name rather than silently ignored. Every route
needs `Authorization: Bearer <the run's token>` (what the `openai` client sends as its
api_key) unless the run's auth.required is false.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from relayrl import auth
from relayrl.config.rollout import MAX_SEED, MAX_TEMPERATURE
from relayrl.http_server import BackgroundHTTPServer, BearerGuard
from relayrl.json_types import json_int
from relayrl.roles import TokenBook
from rollout_svc.custom import CustomGenerator
from rollout_svc.http_limits import BodyLimit


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


def _sampling(gen: CustomGenerator, prompt: list[int], max_tokens, temperature, n, seed,
              ignore_eos: bool, where: str, prompt_field: str):
    # OpenAI's temperature 0 means greedy
    greedy = temperature == 0
    return gen.request(token_ids=prompt, max_new_tokens=max_tokens or 0,
                       temperature=0.0 if greedy or temperature is None else temperature,
                       n=n, greedy=greedy, seed=seed or 0, ignore_eos=ignore_eos,
                       where=where, prompt_field=prompt_field)


STREAM_CHUNK_TOKENS = 8  # tokens per streamed event; the worker may change version between them


class _TextDiff:
    """Text of a growing token sequence, handed out as the part not yet sent: decoding
    tokens one chunk at a time would split characters and merges."""

    def __init__(self, gen: CustomGenerator):
        self.gen, self.tokens, self.sent = gen, [], ""

    def add(self, tokens: list[int]) -> str:
        self.tokens.extend(tokens)
        text = self.gen.decode(self.tokens)
        if text.endswith("\ufffd"):  # a character still incomplete: wait for its next token
            return ""
        new = text[len(self.sent):] if text.startswith(self.sent) else text
        self.sent = text
        return new


def _sse(events):
    import json

    for event in events:
        yield f"data: {json.dumps(event)}\n\n"
    yield "data: [DONE]\n\n"


def _error_body(message: str, param: str | None = None, status: int = 400) -> bytes:
    import json

    kind = "invalid_request_error" if status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": param,
                                 "code": None}}).encode()


def _error(status: int, message: str, param: str | None = None):
    from fastapi.responses import Response

    return Response(_error_body(message, param, status), status_code=status,
                    media_type="application/json")


def _shown(value) -> str:
    """A value sent, as a refusal quotes it (NaN and infinities included), cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def build_app(gen: CustomGenerator, model_name: str,
              stream_chunk_tokens: int = STREAM_CHUNK_TOKENS,
              token: str | TokenBook | None = None):
    """`token` None serves everyone (auth.required false)."""
    from fastapi import FastAPI, HTTPException
    from fastapi.exceptions import RequestValidationError

    app = FastAPI(title="RelayRL rollout worker (OpenAI-compatible)", version="1")
    # added last, the token check runs first: an unauthorised body is never read
    app.add_middleware(BodyLimit, limit=gen.defaults.max_request_bytes,
                       field="rollout.max_request_bytes",
                       render=lambda message: _error_body(message, "body"))
    if token is not None:
        app.add_middleware(BearerGuard, token=token)

    # errors in OpenAI's shape, so its clients show the message naming the field
    @app.exception_handler(HTTPException)
    def http_error(request, exc: HTTPException):
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    def invalid(request, exc: RequestValidationError):
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or "body"
        got = f", got {_shown(first['input'])}" if "input" in first else ""
        return _error(400, f"{param}: {first.get('msg', 'invalid')}{got}", param)

    def check_model(name: str) -> None:
        if name != model_name:
            raise HTTPException(404, f"model: {name!r} is not served here; use {model_name!r}")

    def check(prompt: list[int], body, max_tokens, where: str):
        try:
            return _sampling(gen, prompt, max_tokens, body.temperature, body.n, body.seed,
                             body.ignore_eos, where,
                             "messages" if where == "chat.completions" else "prompt")
        except ValueError as err:  # named as OpenAI names the field
            raise HTTPException(400, str(err).replace("max_new_tokens", "max_tokens")) from None

    def run(prompt: list[int], body, max_tokens, where: str):
        req = check(prompt, body, max_tokens, where)
        version, outs = gen.generate(req)
        return req, version, outs

    def stream(req, head: dict, choice):
        """Server-sent events, one per chunk of one choice; `choice(chunk, text, first)`
        shapes the choice of each event."""
        from fastapi.responses import StreamingResponse

        def events():
            texts = [_TextDiff(gen) for _ in range(req.n)]
            started = [False] * req.n
            for c in gen.stream(req, min(stream_chunk_tokens, req.spec.max_new_tokens)):
                text = texts[c.index].add(c.tokens)
                yield {**head, "choices": [choice(c, text, not started[c.index])],
                       "policy_version": c.version}
                started[c.index] = True

        return StreamingResponse(_sse(events()), media_type="text/event-stream")

    def usage(prompt: list[int], outs) -> dict:
        done = sum(len(o.tokens) for o in outs)
        return {"prompt_tokens": len(prompt), "completion_tokens": done,
                "total_tokens": len(prompt) + done}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": int(time.time()),
            "owned_by": "relayrl", "policy_version": gen.engine.version}]}

    @app.post("/tokenize")
    def tokenize(body: TokenizeRequest) -> dict:
        ids = (gen.lm.encode_prompt(body.prompt) if body.add_special_tokens
               else gen.lm.tokenizer.encode(body.prompt, add_special_tokens=False))
        return {"tokens": ids, "count": len(ids)}

    @app.post("/v1/completions")
    def completions(body: CompletionRequest):
        check_model(body.model)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise HTTPException(400, "prompt: one prompt per request (use n for several)")
            prompt = prompt[0]
        ids = gen.lm.encode_prompt(prompt) if isinstance(prompt, str) else list(prompt)
        if body.stream:
            head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                    "created": int(time.time()), "model": model_name}
            return stream(check(ids, body, body.max_tokens, "completions"), head,
                          lambda c, text, first: {
                              "index": c.index, "text": text,
                              "finish_reason": c.finish_reason or None,
                              "logprobs": None if body.logprobs is None else {
                                  "tokens": [gen.decode([t]) for t in c.tokens],
                                  "token_logprobs": c.logprobs, "top_logprobs": None},
                              "token_ids": c.tokens,
                              "policy_versions": [c.version] * len(c.tokens)})
        _, version, outs = run(ids, body, body.max_tokens, "completions")
        choices = []
        for i, o in enumerate(outs):
            pieces = [gen.decode([t]) for t in o.tokens]
            offsets = [sum(len(p) for p in pieces[:k]) for k in range(len(pieces))]
            choices.append({
                "index": i, "text": gen.decode(o.tokens), "finish_reason": o.finish_reason,
                "logprobs": None if body.logprobs is None else {
                    "tokens": pieces, "token_logprobs": o.logprobs, "top_logprobs": None,
                    "text_offset": offsets},
                "token_ids": o.tokens, "policy_versions": [version] * len(o.tokens)})
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": model_name, "choices": choices,
                "usage": usage(ids, outs), "prompt_token_ids": ids, "policy_version": version}

    @app.post("/v1/chat/completions")
    def chat(body: ChatRequest):
        check_model(body.model)
        ids = gen.lm.encode_chat([m.model_dump(exclude_none=True) for m in body.messages])
        if body.stream:
            head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
                    "created": int(time.time()), "model": model_name}
            return stream(
                check(ids, body, body.max_completion_tokens or body.max_tokens,
                      "chat.completions"), head,
                lambda c, text, first: {
                    "index": c.index, "finish_reason": c.finish_reason or None,
                    "delta": {"role": "assistant", "content": text} if first
                    else {"content": text},
                    "logprobs": {"content": [
                        {"token": gen.decode([t]), "logprob": lp, "top_logprobs": []}
                        for t, lp in zip(c.tokens, c.logprobs, strict=True)]}
                    if body.logprobs else None,
                    "token_ids": c.tokens, "policy_versions": [c.version] * len(c.tokens)})
        _, version, outs = run(ids, body, body.max_completion_tokens or body.max_tokens,
                               "chat.completions")
        choices = []
        for i, o in enumerate(outs):
            content = [{"token": gen.decode([t]), "logprob": lp, "top_logprobs": []}
                       for t, lp in zip(o.tokens, o.logprobs, strict=True)]
            choices.append({
                "index": i, "finish_reason": o.finish_reason,
                "message": {"role": "assistant", "content": gen.decode(o.tokens)},
                "logprobs": {"content": content} if body.logprobs else None,
                "token_ids": o.tokens, "policy_versions": [version] * len(o.tokens)})
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": model_name, "choices": choices,
                "usage": usage(ids, outs), "prompt_token_ids": ids, "policy_version": version}

    return app


class OpenAIServer(BackgroundHTTPServer):
    """`credentials` defaults to the process's (auth.current()), like the gRPC servers'."""

    def __init__(self, gen: CustomGenerator, host: str, port: int, model_name: str,
                 stream_chunk_tokens: int = STREAM_CHUNK_TOKENS,
                 credentials: auth.Credentials | None = None):
        token = (credentials or auth.current()).book  # agent, service (relayrl.roles)
        super().__init__(build_app(gen, model_name, stream_chunk_tokens, token), host, port,
                         "openai-http")
