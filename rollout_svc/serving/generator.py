"""Generation for custom rollouts, shared by the gRPC Generate API and the OpenAI-compatible
HTTP server: validate a request against the worker's limits, run it on the worker's engine,
and report every token's log-probability and policy version."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

from relayrl.config import RolloutConfig
from relayrl.config.rollout import MAX_SEED, MAX_TEMPERATURE, MIN_TEMPERATURE
from relayrl_torch.models.loading import LoadedModel
from relayrl_torch.sampling.sampler import Completion
from rollout_svc.engines import stop_strings
from rollout_svc.engines.api import MAX_TOP_LOGPROBS, Engine, SamplingSpec, structured_kind
from rollout_svc.serving.batcher import RequestBatcher

MAX_N = 64


@dataclass
class Chunk:
    index: int
    tokens: list[int]
    logprobs: list[float]
    version: int
    finish_reason: str  # "" until the sequence's last chunk
    stop_reason: str | None = None  # the stop string that ended the sequence
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class Request:
    prompt: list[int]
    spec: SamplingSpec
    n: int


class CustomGenerator:
    def __init__(self, engine: Engine, lm: LoadedModel, defaults: RolloutConfig):
        self.engine = engine
        self.lm = lm
        self.defaults = defaults
        self.vocab_size = len(lm.tokenizer)
        self.batcher = RequestBatcher(engine, defaults.max_batch_seqs,
                                      defaults.batch_wait_ms / 1e3)
        self.requests = 0
        self.tokens_out = 0

    def request(self, *, text: str = "", token_ids: list[int] | None = None,
                max_new_tokens: int = 0, temperature: float = 0.0, n: int = 0,
                greedy: bool = False, seed: int = 0, ignore_eos: bool = False,
                where: str = "", prompt_field: str = "", stop: tuple[str, ...] = (),
                top_logprobs: int = 0, top_logprobs_field: str = "top_logprobs",
                structured: str = "", structured_what: str = "") -> Request:
        """Check a request and fill in the worker's defaults; ValueError names the field, the
        value and the limit. Sizes are checked before the work they would cost (tokenizing,
        scanning ids); `prompt_field` names the prompt as the caller's API does."""
        pre = f"{where}." if where else ""
        limits = self.defaults
        if structured and self.engine.name != "vllm":  # before any work on the prompt
            what = structured_what or f"response_format: {structured_kind(structured)}"
            raise ValueError(f"{pre}{what} needs the vllm engine's structured outputs "
                             "(rollout.engine.kind: vllm); "
                             f"this worker runs the {self.engine.name} engine")
        if token_ids:
            field = f"{pre}{prompt_field or 'token_ids'}"
            self._check_prompt_tokens(field, len(token_ids))
            bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"{field}: {bad[:3]} outside the vocabulary "
                                 f"(0..{self.vocab_size - 1})")
            prompt = list(token_ids)
        elif text:
            field = f"{pre}{prompt_field or 'text'}"
            size = len(text.encode())
            if size > limits.max_request_bytes:
                raise ValueError(f"{field}: {size} bytes, more than rollout.max_request_bytes "
                                 f"({limits.max_request_bytes})")
            prompt = self.lm.encode_prompt(text)
            self._check_prompt_tokens(field, len(prompt))
        else:
            raise ValueError(f"{pre}prompt: give text or token_ids")
        room = self.engine.context_length - len(prompt)
        if room < 1:
            raise ValueError(f"{field}: {len(prompt)} tokens leave no room to generate in the "
                             f"model's context of {self.engine.context_length} tokens")
        limit = limits.max_new_tokens
        max_new = max_new_tokens or min(limit, room)  # unasked: what the context leaves
        if not 1 <= max_new <= limit:
            raise ValueError(f"{pre}max_new_tokens: must be in 1..{limit} "
                             f"(rollout.max_new_tokens), got {max_new}")
        if max_new > room:
            raise ValueError(f"{pre}max_new_tokens: {len(prompt)} prompt tokens + {max_new} "
                             f"exceed the model's context length "
                             f"({self.engine.context_length})")
        if temperature != 0 and not (math.isfinite(temperature)
                                     and MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE):
            raise ValueError(f"{pre}temperature: must be 0 or in [{MIN_TEMPERATURE}, "
                             f"{MAX_TEMPERATURE}], got {temperature!r}")
        n = n or 1
        if not 1 <= n <= MAX_N:
            raise ValueError(f"{pre}n: must be in 1..{MAX_N}, got {n}")
        if not 0 <= seed <= MAX_SEED:
            raise ValueError(f"{pre}seed: must be in 0..{MAX_SEED}, got {seed}")
        stop = stop_strings.check(stop, f"{pre}stop")
        if not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"{pre}{top_logprobs_field}: must be in 0..{MAX_TOP_LOGPROBS}, "
                             f"got {top_logprobs}")
        spec = SamplingSpec(max_new_tokens=max_new,
                            temperature=temperature or limits.temperature,
                            greedy=greedy, seed=seed or None, ignore_eos=ignore_eos,
                            stop=stop, top_logprobs=top_logprobs, structured=structured)
        return Request(prompt, spec, n)

    def _check_prompt_tokens(self, field: str, count: int) -> None:
        limit = self.defaults.max_prompt_tokens
        if count > limit:
            raise ValueError(f"{field}: {count} tokens, more than rollout.max_prompt_tokens "
                             f"({limit})")

    def generate(self, req: Request) -> tuple[int, list[Completion]]:
        """All n completions under one version: (version, completions). Concurrent requests
        share engine calls (see RequestBatcher)."""
        version, outs = self.batcher.generate([req.prompt] * req.n, req.spec)
        self._count(outs)
        return version, outs

    def stream(self, req: Request, chunk_tokens: int = 1) -> Iterator[Chunk]:
        """Chunks of at most `chunk_tokens` tokens per sequence; the engine may move to newer
        weights between chunks (each chunk names its version). Stop strings are matched here,
        over each sequence's tokens so far (one may span two chunks): the chunk that
        completes one is cut at the token completing it and ends the sequence."""
        if req.spec.structured:  # each chunk's call would start the grammar over
            raise ValueError("structured: constrained output is not streamed")
        if not 1 <= chunk_tokens <= req.spec.max_new_tokens:
            raise ValueError(f"chunk_tokens: must be in 1..{req.spec.max_new_tokens}, "
                             f"got {chunk_tokens}")
        made: list[list[int]] = [[] for _ in range(req.n)]
        live = list(range(req.n))
        step = 0
        while live:
            room = req.spec.max_new_tokens - len(made[live[0]])
            spec = replace(req.spec, max_new_tokens=min(chunk_tokens, room),
                           seed=None if req.spec.seed is None
                           else (req.spec.seed + step) % (MAX_SEED + 1),
                           keep_state=True, stop=())
            with self.engine.lock:
                version = self.engine.version
                outs = self.engine.generate([req.prompt + made[i] for i in live], spec)
            self._count(outs)
            still = []
            for i, out in zip(live, outs, strict=True):
                tokens, logprobs, top = out.tokens, out.logprobs, out.top_logprobs
                found = stop_strings.first_stop(self.decode, made[i] + tokens, req.spec.stop)
                keep = len(tokens) if found is None else max(found[0] - len(made[i]), 0)
                tokens, logprobs = tokens[:keep], logprobs[:keep]
                top = None if top is None else top[:keep]
                made[i].extend(tokens)
                if found is not None or out.finish_reason == "stop":
                    finish = "stop"
                elif len(made[i]) >= req.spec.max_new_tokens:
                    finish = "length"
                else:
                    finish = ""
                    still.append(i)
                yield Chunk(i, tokens, logprobs, version, finish,
                            None if found is None else found[1], top)
            live, step = still, step + 1

    def decode(self, tokens: list[int]) -> str:
        return self.lm.decode(tokens)

    def _count(self, outs: list[Completion]) -> None:
        self.requests += 1
        self.tokens_out += sum(len(o.tokens) for o in outs)
