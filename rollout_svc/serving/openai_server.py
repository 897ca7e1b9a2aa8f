"""An OpenAI-compatible HTTP server on a rollout worker, for agents that run their own
episodes: /v1/completions, /v1/chat/completions, /v1/models and /tokenize.

Responses follow OpenAI's shapes, plus what RL needs and OpenAI does not give: each choice's
`token_ids` and `policy_versions`, the response's `prompt_token_ids` and `policy_version`.
Chat requests may declare `tools` (rendered through the model's chat template,
relayrl.plugins.chat); calls the model writes come back as the message's `tool_calls`. An
assistant turn sent back is rendered as the tokens the model wrote
(rollout_svc.serving.chat_turns), so each turn's `prompt_token_ids` extends the turn before
it and its completion exactly (turns are remembered per agent token,
rollout.turn_memory_per_agent each):
relayrl.plugins.buffer_client.trajectory_from_turns makes them one trainable trajectory.
Fields we do not implement are refused by name rather than silently ignored (the request
bodies and the refusals are in rollout_svc.serving.openai_requests). Every route needs
`Authorization: Bearer <the run's token>` (what the `openai` client sends as its api_key)
unless the run's auth.required is false. rollout_svc.server starts it when
rollout.http_base_port is set; tests/integration/test_custom_rollouts.py exercises it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fastapi import Request

from relayrl.plugins.buffer_client import ChatTurn
from relayrl.plugins.chat import parse_tool_calls
from relayrl.runtime import auth
from relayrl.runtime.http_server import BackgroundHTTPServer, BearerGuard, BodyLimit
from relayrl.runtime.roles import TokenBook
from relayrl_tasks.episodes.turns import TurnGlue
from rollout_svc.engines import stop_strings
from rollout_svc.serving.agent_episodes import AgentEpisodes, EpisodeRefused
from rollout_svc.serving.chat_turns import TurnMemories, TurnMemory, credential_key
from rollout_svc.serving.generator import CustomGenerator
from rollout_svc.serving.openai_requests import (
    ChatRequest,
    CompletionRequest,
    EpisodeReward,
    TokenizeRequest,
    error_body,
    http_error,
    invalid_body,
    sampling,
    taking,
    vllm_parsed,
)

STREAM_CHUNK_TOKENS = 8  # tokens per streamed event; the worker may change version between them
# the episode a request's turn belongs to, and its task where the first prompt does not say
# it: headers, or metadata relayrl_episode and relayrl_task
EPISODE_HEADER = "x-relayrl-episode"
TASK_HEADER = "x-relayrl-task"


class _TextDiff:
    """Text of a growing token sequence, handed out as the part not yet sent: decoding
    tokens one chunk at a time would split characters and merges. With stop strings, the
    last characters that could begin one are held back until the next chunk (as vLLM holds
    them), and a sequence a stop string ended hands out its text before it only."""

    def __init__(self, gen: CustomGenerator, stops: tuple[str, ...] = ()):
        self.gen, self.tokens, self.sent = gen, [], ""
        self.hold = max((len(s) for s in stops), default=1) - 1

    def add(self, tokens: list[int], done: bool = False, stop: str | None = None) -> str:
        self.tokens.extend(tokens)
        text = self.gen.decode(self.tokens)
        if stop:
            text = stop_strings.cut(text, stop)
        elif not done:
            if text.endswith("\ufffd"):  # a character still incomplete: wait for its next
                return ""
            text = text[:len(text) - self.hold]
        new = text[len(self.sent):] if text.startswith(self.sent) else text
        self.sent = text
        return new


def _sse(events):
    for event in events:
        yield f"data: {json.dumps(event)}\n\n"
    yield "data: [DONE]\n\n"


def _usage(prompt: list[int], outs) -> dict:
    done = sum(len(o.tokens) for o in outs)
    return {"prompt_tokens": len(prompt), "completion_tokens": done,
            "total_tokens": len(prompt) + done}


class _Routes:
    """The route handlers, over one generator serving one model name."""

    def __init__(self, gen: CustomGenerator, model_name: str, stream_chunk_tokens: int,
                 turns: TurnMemories, by_credential: bool, episodes: AgentEpisodes | None):
        self.gen = gen
        self.model_name = model_name
        self.stream_chunk_tokens = stream_chunk_tokens
        self.turns = turns
        self.by_credential = by_credential  # False: no tokens checked, every caller is one
        self.episodes = episodes  # None: tagged episodes are not recorded here

    def _owner(self, request: Request) -> str:
        return credential_key(request.headers.get("authorization") if self.by_credential
                              else None)

    def _episode(self, request: Request, body, ids: list[int]) -> tuple[str, str] | None:
        """(episode, task) of a tagged request, its turn checked before it is generated
        (rollout_svc.serving.agent_episodes); None for an untagged one."""
        from fastapi import HTTPException

        # a header, or metadata for a framework that sets no headers
        tags = getattr(body, "metadata", None) or {}
        episode = request.headers.get(EPISODE_HEADER) or tags.get("relayrl_episode")
        if episode is None:
            return None
        if self.episodes is None:
            raise HTTPException(400, f"{EPISODE_HEADER}: this server records no episodes "
                                "(rollout.train_loop false, or no buffer to submit to)")
        if body.n != 1:
            raise HTTPException(400, f"n: {body.n}; an episode's turn takes one choice")
        task = request.headers.get(TASK_HEADER) or tags.get("relayrl_task")
        try:
            self.episodes.check(self._owner(request), episode, ids, task)
        except EpisodeRefused as err:
            raise HTTPException(err.status, str(err)) from None
        return episode, task

    def _record(self, request: Request, tag: tuple[str, str] | None, ids: list[int],
                tokens: list[int], logprobs: list[float], versions: list[int],
                finish_reason: str) -> None:
        if tag is not None:
            self.episodes.record(self._owner(request), tag[0], tag[1],
                                 ChatTurn(ids, tokens, logprobs, versions), finish_reason)

    def reward(self, episode_id: str, body: EpisodeReward, request: Request) -> dict:
        """POST /v1/episodes/{episode_id}/reward: the episode's one reward."""
        from fastapi import HTTPException

        if self.episodes is None:
            raise HTTPException(404, "episodes: this server records no episodes")
        try:
            status = self.episodes.reward(self._owner(request), episode_id, body.reward)
        except EpisodeRefused as err:
            raise HTTPException(err.status, str(err)) from None
        return {"episode": episode_id, "status": status}

    def _turns_of(self, request: Request) -> TurnMemory:
        """The caller's own turn memory, by its bearer token."""
        return self.turns.of(request.headers.get("authorization") if self.by_credential
                             else None)

    def _check_model(self, name: str) -> None:
        from fastapi import HTTPException

        if name != self.model_name:
            raise HTTPException(404, f"model: {name!r} is not served here; use "
                                f"{self.model_name!r}")

    def _check(self, prompt: list[int], body, max_tokens, where: str):
        from fastapi import HTTPException

        chat = where == "chat.completions"
        top = (body.top_logprobs or 0) if chat else (body.logprobs or 0)
        try:
            return sampling(self.gen, prompt, max_tokens, body.temperature, body.n, body.seed,
                            body.ignore_eos, where, "messages" if chat else "prompt",
                            body.stops, top, "top_logprobs" if chat else "logprobs",
                            body.structured if chat else "",
                            body.structured_what if chat else "")
        except ValueError as err:  # named as OpenAI names the field
            raise HTTPException(400, str(err).replace("max_new_tokens", "max_tokens")) from None

    def _run(self, prompt: list[int], body, max_tokens, where: str):
        from fastapi import HTTPException

        req = self._check(prompt, body, max_tokens, where)
        try:
            version, outs = self.gen.generate(req)
        except ValueError as err:
            if not req.spec.structured:
                raise
            # vLLM checks a schema when the request is added, before any work
            raise HTTPException(400, f"{where}.response_format: {err}") from None
        return req, version, outs

    def _stream(self, req, head: dict, choice, include_usage: bool = False, done=None,
                closing=None):
        """Server-sent events, one per chunk of one choice; `choice(chunk, text, first)`
        shapes the choice of each event. `include_usage`: every event has usage null and a
        last one, with no choices, the request's usage (as OpenAI's stream_options).
        `closing(index, tokens, finish_reason, stop_reason)` is handed each choice whole
        once it has finished, and may return the choice of one more event. `done(tokens,
        logprobs, versions, finish_reason)` is handed the first choice whole once every
        choice has streamed."""
        from fastapi.responses import StreamingResponse

        gen = self.gen
        usage = {"usage": None} if include_usage else {}

        def events():
            texts = [_TextDiff(gen, req.spec.stop) for _ in range(req.n)]
            started = [False] * req.n
            made = 0
            tokens, logprobs, versions = ([[] for _ in range(req.n)] for _ in range(3))
            finish = ["length"] * req.n
            for c in gen.stream(req, min(self.stream_chunk_tokens, req.spec.max_new_tokens)):
                i = c.index
                text = texts[i].add(c.tokens, bool(c.finish_reason), c.stop_reason)
                made += len(c.tokens)
                yield {**head, "choices": [choice(c, text, not started[i])],
                       "policy_version": c.version, **usage}
                started[i] = True
                tokens[i] += c.tokens
                logprobs[i] += c.logprobs
                versions[i] += [c.version] * len(c.tokens)
                if c.finish_reason:
                    finish[i] = c.finish_reason
                    last = closing and closing(i, tokens[i], c.finish_reason, c.stop_reason)
                    if last:
                        yield {**head, "choices": [last], "policy_version": c.version,
                               **usage}
            if done is not None:
                done(tokens[0], logprobs[0], versions[0], finish[0])
            if include_usage:
                yield {**head, "choices": [], "usage": {
                    "prompt_tokens": len(req.prompt), "completion_tokens": made,
                    "total_tokens": len(req.prompt) + made}}

        return StreamingResponse(_sse(events()), media_type="text/event-stream")

    def _head(self, prefix: str, kind: str) -> dict:
        return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind,
                "created": int(time.time()), "model": self.model_name}

    def models(self) -> dict:
        return {"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "relayrl", "policy_version": self.gen.engine.version}]}

    def tokenize(self, body: TokenizeRequest) -> dict:
        lm = self.gen.lm
        ids = (lm.encode_prompt(body.prompt) if body.add_special_tokens
               else lm.tokenizer.encode(body.prompt, add_special_tokens=False))
        return {"tokens": ids, "count": len(ids)}

    def completions(self, body: CompletionRequest, request: Request):
        from fastapi import HTTPException

        gen = self.gen
        self._check_model(body.model)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise HTTPException(400, "prompt: one prompt per request (use n for several)")
            prompt = prompt[0]
        ids = gen.lm.encode_prompt(prompt) if isinstance(prompt, str) else list(prompt)
        tag = self._episode(request, body, ids)
        if body.stream:
            head = self._head("cmpl", "text_completion")
            return self._stream(self._check(ids, body, body.max_tokens, "completions"), head,
                                lambda c, text, first: {
                                    "index": c.index, "text": text,
                                    "finish_reason": c.finish_reason or None,
                                    "logprobs": None if body.logprobs is None else {
                                        "tokens": [gen.decode([t]) for t in c.tokens],
                                        "token_logprobs": c.logprobs,
                                        "top_logprobs": self._top_dicts(c.top_logprobs)},
                                    "token_ids": c.tokens,
                                    "policy_versions": [c.version] * len(c.tokens)},
                                body.include_usage,
                                lambda *turn: self._record(request, tag, ids, *turn))
        _, version, outs = self._run(ids, body, body.max_tokens, "completions")
        self._record(request, tag, ids, outs[0].tokens, outs[0].logprobs,
                     [version] * len(outs[0].tokens), outs[0].finish_reason)
        choices = []
        for i, o in enumerate(outs):
            pieces = [gen.decode([t]) for t in o.tokens]
            offsets = [sum(len(p) for p in pieces[:k]) for k in range(len(pieces))]
            choices.append({
                "index": i, "text": stop_strings.cut(gen.decode(o.tokens), o.stop_reason),
                "finish_reason": o.finish_reason,
                "logprobs": None if body.logprobs is None else {
                    "tokens": pieces, "token_logprobs": o.logprobs,
                    "top_logprobs": self._top_dicts(o.top_logprobs), "text_offset": offsets},
                "token_ids": o.tokens, "policy_versions": [version] * len(o.tokens)})
        return {**self._head("cmpl", "text_completion"), "choices": choices,
                "usage": _usage(ids, outs), "prompt_token_ids": ids, "policy_version": version}

    def _top_dicts(self, top) -> list[dict[str, float]] | None:
        """Completions' top_logprobs: a {token text: logprob} per position."""
        if top is None:
            return None
        return [{self.gen.decode([t]): lp for t, lp in position} for position in top]

    def _content(self, tokens: list[int], logprobs: list[float], top) -> list[dict]:
        """Chat's logprobs.content: each token, its logprob and its top_logprobs."""
        decode = self.gen.decode
        return [{"token": decode([t]), "logprob": lp, "top_logprobs": [] if top is None else
                 [{"token": decode([a]), "logprob": b} for a, b in top[k]]}
                for k, (t, lp) in enumerate(zip(tokens, logprobs, strict=True))]

    def _prompt(self, body: ChatRequest, turns: TurnMemory) -> list[int]:
        """The conversation's token ids, its remembered assistant turns as their tokens."""
        tools = [t.model_dump(exclude_none=True) for t in body.tools or ()]
        glue = TurnGlue(self.gen.lm.tokenizer, self.gen.lm.eos_ids, tools)
        messages = template_messages(body)
        try:
            return turns.render(glue, messages)
        except ValueError:  # a template that rewrites earlier turns: render it whole
            return glue.prompt(messages)

    def _message(self, body: ChatRequest, text: str) -> tuple[dict[str, Any], bool]:
        """The assistant message of a choice, and whether it made tool calls."""
        if body.forces_call:
            return self._forced(body, text)
        reply = parse_tool_calls(text) if body.calls_tools else None
        declared = {t.function.name for t in body.tools or ()}
        # a call of a function not declared is no call (and its name could not be sent back)
        if not reply or not reply.calls or any(c.name not in declared for c in reply.calls):
            return {"role": "assistant", "content": text}, False
        calls = reply.calls if body.parallel_tool_calls else reply.calls[:1]
        return _calls_message(reply.content or None,
                              [(c.name, json.dumps(c.arguments)) for c in calls])

    def _forced(self, body: ChatRequest, text: str) -> tuple[dict[str, Any], bool]:
        """A forced call's reply, which the schema made JSON (as vLLM's server reads it):
        a named function's arguments, or for 'required' a list of {name, parameters}. A
        reply cut short by max_tokens is no JSON: it comes back as content."""
        try:
            value = json.loads(text)
        except ValueError:
            return {"role": "assistant", "content": text}, False
        named = body.forced_function
        if named is not None:
            if not isinstance(value, dict):
                return {"role": "assistant", "content": text}, False
            return _calls_message(None, [(named, json.dumps(value))])
        if not (isinstance(value, list) and value and all(
                isinstance(c, dict) and isinstance(c.get("name"), str)
                and isinstance(c.get("parameters"), dict) for c in value)):
            return {"role": "assistant", "content": text}, False
        return _calls_message(None, [(c["name"], json.dumps(c["parameters"])) for c in value])

    def chat(self, body: ChatRequest, request: Request):
        gen = self.gen
        self._check_model(body.model)
        turns = self._turns_of(request)
        ids = self._prompt(body, turns)
        tag = self._episode(request, body, ids)
        if body.stream:
            return self._chat_stream(body, request, ids, tag, turns)
        _, version, outs = self._run(ids, body, body.max_completion_tokens or body.max_tokens,
                                     "chat.completions")
        self._record(request, tag, ids, outs[0].tokens, outs[0].logprobs,
                     [version] * len(outs[0].tokens), outs[0].finish_reason)
        choices = []
        for i, o in enumerate(outs):
            content = self._content(o.tokens, o.logprobs, o.top_logprobs)
            text = stop_strings.cut(gen.decode(o.tokens), o.stop_reason)
            message, called = self._message(body, text)
            # a stop string ends the text, not the turn: the template's closing follows
            turns.remember(ids, message, o.tokens,
                           o.finish_reason == "stop" and o.stop_reason is None, text)
            choices.append({
                "index": i,
                "finish_reason": "tool_calls" if called and o.finish_reason == "stop"
                else o.finish_reason,
                "message": message,
                "logprobs": {"content": content} if body.logprobs else None,
                "token_ids": o.tokens, "policy_versions": [version] * len(o.tokens)})
        return {**self._head("chatcmpl", "chat.completion"), "choices": choices,
                "usage": _usage(ids, outs), "prompt_token_ids": ids, "policy_version": version}

    def _chat_stream(self, body: ChatRequest, request: Request, ids: list[int], tag,
                     turns: TurnMemory):
        """A chat completion as server-sent events. With tools, each chunk carries its
        token ids, log-probabilities and versions but no text: a call is known only once
        its text is whole, so a choice's content and tool-call deltas (each call whole, at
        its `index`) come in one more event when it finishes, as vLLM's server sends a
        call's name and arguments in deltas of their own."""
        calls = body.calls_tools

        def choice(c, text: str, first: bool) -> dict:
            delta = {"role": "assistant"} if first else {}
            if not calls:
                delta["content"] = text
            return {"index": c.index, "delta": delta,
                    "finish_reason": None if calls else c.finish_reason or None,
                    "logprobs": {"content": self._content(c.tokens, c.logprobs,
                                                          c.top_logprobs)}
                    if body.logprobs else None,
                    "token_ids": c.tokens, "policy_versions": [c.version] * len(c.tokens)}

        def closing(index: int, tokens: list[int], finish: str, stop: str | None):
            text = stop_strings.cut(self.gen.decode(tokens), stop)
            message, called = self._message(body, text)
            turns.remember(ids, message, tokens, finish == "stop" and stop is None, text)
            if not calls:
                return None
            delta = {"content": message["content"]}
            if called:
                delta["tool_calls"] = [{"index": k, **call}
                                       for k, call in enumerate(message["tool_calls"])]
            return {"index": index, "delta": delta,
                    "finish_reason": "tool_calls" if called and finish == "stop" else finish,
                    "logprobs": None, "token_ids": [], "policy_versions": []}

        return self._stream(
            self._check(ids, body, body.max_completion_tokens or body.max_tokens,
                        "chat.completions"), self._head("chatcmpl", "chat.completion.chunk"),
            choice, body.include_usage, lambda *turn: self._record(request, tag, ids, *turn),
            closing)


def _calls_message(content: str | None, calls: list[tuple[str, str]]
                  ) -> tuple[dict[str, Any], bool]:
    """An assistant message making `calls` (name, arguments as JSON text)."""
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
         "function": {"name": name, "arguments": arguments}} for name, arguments in calls]}, True


def template_messages(body: ChatRequest) -> list[dict[str, Any]]:
    """The request's messages as chat templates take them (a call's arguments an object,
    checked to be one when the body was read)."""
    out = []
    for m in body.messages:
        d: dict[str, Any] = m.model_dump(exclude_none=True, exclude={"tool_calls"})
        d["content"] = m.content or ""
        if m.tool_calls:
            d["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": json.loads(c.function.arguments)}}
                for c in m.tool_calls]
        out.append(d)
    return out


def build_app(gen: CustomGenerator, model_name: str,
              stream_chunk_tokens: int = STREAM_CHUNK_TOKENS,
              token: str | TokenBook | None = None, turns: TurnMemories | None = None,
              episodes: AgentEpisodes | None = None):
    """`token` None serves everyone (auth.required false); `turns`: where chat turns are
    remembered (by default rollout.turn_memory_per_agent for each token); `episodes`: where
    tagged episodes are recorded (None: a tagged request is refused)."""
    from fastapi import FastAPI, HTTPException
    from fastapi.exceptions import RequestValidationError

    app = FastAPI(title="RelayRL rollout worker (OpenAI-compatible)", version="1")
    # added last, the token check runs first: an unauthorised body is never read
    app.add_middleware(BodyLimit, limit=gen.defaults.max_request_bytes,
                       field="rollout.max_request_bytes",
                       render=lambda message: error_body(message, "body"))
    if token is not None:
        app.add_middleware(BearerGuard, token=token)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid_body)
    turns = turns or TurnMemories(gen.defaults.turn_memory_per_agent)
    routes = _Routes(gen, model_name, stream_chunk_tokens, turns, token is not None, episodes)
    app.get("/v1/models")(routes.models)
    app.post("/tokenize")(routes.tokenize)
    if gen.engine.name == "vllm":  # the bodies as vLLM's server parses them
        app.post("/v1/completions")(taking(routes.completions, vllm_parsed(CompletionRequest)))
        app.post("/v1/chat/completions")(taking(routes.chat, vllm_parsed(ChatRequest)))
    else:
        app.post("/v1/completions")(routes.completions)
        app.post("/v1/chat/completions")(routes.chat)
    app.post("/v1/episodes/{episode_id}/reward")(routes.reward)
    return app


class OpenAIServer(BackgroundHTTPServer):
    """`credentials` defaults to the process's (auth.current()), like the gRPC servers'."""

    def __init__(self, gen: CustomGenerator, host: str, port: int, model_name: str,
                 stream_chunk_tokens: int = STREAM_CHUNK_TOKENS,
                 credentials: auth.Credentials | None = None,
                 turns: TurnMemories | None = None, episodes: AgentEpisodes | None = None):
        creds = credentials or auth.current()
        token = creds.book  # agent, service (relayrl.runtime.roles)
        super().__init__(build_app(gen, model_name, stream_chunk_tokens, token, turns,
                                   episodes), host, port, "openai-http", creds)
