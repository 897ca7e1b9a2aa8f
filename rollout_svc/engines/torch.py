"""The compact torch engine: a Hugging Face causal LM sampled with a KV cache.

With kv_cache_tokens > 0 it also keeps the final KV state of every sequence that ran out of
budget (least recently used evicted first, up to that many tokens), so the sequence's next
segment resumes instead of re-prefilling (and, asked with keep_stopped, of every episode's
sequence, whose next turn then prefills only the environment's tokens), and states can be
exported to and imported from another worker. States are valid for the version that computed
them only: loading weights drops them all.

The engine samples on `device` (rollout.engine.device, resolved by
rollout_svc.engines.factory): the model is moved there once, weights pulled from the relay
arrive as CPU tensors and are copied onto it, and its seeded generator lives there too.
Weights stay in the dtype the model was loaded in (float32), so the engine computes what the
trainer's float32 master weights give.

With record_routes, a mixture-of-experts model's completions carry each fed position's experts
(relayrl_torch.models.routing, for the trainer's routing replay), recorded by hooks on its
routers while it samples. Every context is then prefilled whole: a kept KV state holds no
routes for the positions it covers, so KV reuse is off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

import torch

from relayrl_torch.models.loading import LoadedModel
from relayrl_torch.models.lora import is_lora, load_adapter
from relayrl_torch.models.routing import RouteRecorder, routers
from relayrl_torch.sampling.kv_state import ModelFingerprint, SequenceKV, StateCache, windowed
from relayrl_torch.sampling.sampler import Completion, sample_with_kv
from relayrl_torch.weights.tied import check_state_dict, load_published, tied_aliases, without
from rollout_svc.engines import stop_strings
from rollout_svc.engines.api import Engine, SamplingSpec, structured_kind

log = logging.getLogger(__name__)


class TorchEngine(Engine):
    name = "torch"

    def __init__(self, lm: LoadedModel, seed: int = 0, version: int = 0,
                 kv_cache_tokens: int = 0, device: torch.device | None = None,
                 record_routes: bool = False):
        super().__init__()
        self.device = device or torch.device("cpu")
        lm.model.to(self.device)
        self.lm = lm
        self._tied = tied_aliases(lm.model)
        config = lm.model.config
        self.context_length = (getattr(config, "max_position_embeddings", None)
                               or getattr(config, "n_positions", None) or self.context_length)
        self._version = version
        self.generator = torch.Generator(self.device).manual_seed(seed)
        if kv_cache_tokens and windowed(lm.model):
            log.warning("KV reuse is off: %s attends through a sliding window, whose cache "
                        "cannot be cut per sequence (rollout.engine.kv_cache_tokens %d "
                        "ignored)", lm.model.config.model_type, kv_cache_tokens)
            kv_cache_tokens = 0
        self.recorder = RouteRecorder(lm.model) if record_routes and routers(lm.model) else None
        if kv_cache_tokens and self.recorder is not None:
            log.info("KV reuse is off: routes are recorded for every position, which a kept "
                     "state does not hold (rollout.engine.kv_cache_tokens %d ignored)",
                     kv_cache_tokens)
            kv_cache_tokens = 0
        self.states = StateCache(kv_cache_tokens)
        self.fingerprint = ModelFingerprint.of(lm.model) if kv_cache_tokens else None
        self.tokens_generated = 0
        self.tokens_resumed = 0  # context tokens not re-prefilled thanks to a kept state
        self.busy_s = 0.0

    @property
    def version(self) -> int:
        return self._version

    def generate(self, contexts: list[list[int]], spec: SamplingSpec) -> list[Completion]:
        if spec.structured:
            raise ValueError(f"structured: {structured_kind(spec.structured)} needs the vllm "
                             "engine's structured outputs (rollout.engine.kind: vllm)")
        longest = max((len(c) for c in contexts), default=0)
        if longest >= self.context_length:
            raise ValueError(f"context of {longest} tokens leaves no room to generate: the "
                             f"model's context length is {self.context_length}")
        if longest + spec.max_new_tokens > self.context_length:  # as vLLM stops at its end
            spec = dataclasses.replace(spec, max_new_tokens=self.context_length - longest)
        generator = self.generator
        if spec.seed is not None:
            generator = torch.Generator(self.device).manual_seed(spec.seed)
        with self.lock:
            self.use_threads()
            t0 = time.monotonic()
            caching = self.states.capacity_tokens > 0
            keeping = caching and spec.keep_state
            prior = [self.states.longest_prefix(c) for c in contexts] if caching else None
            with self.recorder or contextlib.nullcontext():  # hooks on its routers
                outs, finals = sample_with_kv(
                    self.lm.model, contexts, max_new_tokens=spec.max_new_tokens,
                    eos_ids=() if spec.ignore_eos else self.lm.eos_ids, pad_id=self.lm.pad_id,
                    temperature=spec.temperature, greedy=spec.greedy, generator=generator,
                    states=prior, return_states=keeping, version=self._version,
                    top_logprobs=spec.top_logprobs, recorder=self.recorder,
                    ends=stop_strings.TailCheck(self.lm.decode, spec.stop) if spec.stop else None)
            if spec.stop:
                outs = [self._stopped(o, spec.stop) for o in outs]
            if caching:
                self._keep(prior, outs, finals if keeping else None, spec.keep_stopped)
            self.busy_s += time.monotonic() - t0
        self.tokens_generated += sum(len(o.tokens) for o in outs)
        return outs

    def _stopped(self, out: Completion, stops: tuple[str, ...]) -> Completion:
        """`out` cut at the token completing its first stop string, exactly (the check
        while sampling reads a tail of the text only)."""
        found = stop_strings.first_stop(self.lm.decode, out.tokens, stops)
        if found is None:
            return out
        keep, stop = found
        return dataclasses.replace(
            out, tokens=out.tokens[:keep], logprobs=out.logprobs[:keep], finish_reason="stop",
            stop_reason=stop,
            top_logprobs=None if out.top_logprobs is None else out.top_logprobs[:keep],
            routes=None if out.routes is None else
            out.routes[:, :out.routes.shape[1] - (len(out.tokens) - keep)])

    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        with self.lock:
            self.use_threads()
            if is_lora(self.lm.model):  # an adapter version: the base stays as it is
                load_adapter(self.lm.model, tensors, version)
            else:
                tensors = without(tensors, self._tied)  # each alias loads with its first name
                check_state_dict(without(self.lm.model.state_dict(), self._tied), tensors,
                                 version)
                load_published(self.lm.model, tensors, self._tied)
            self._version = version
            self.states.clear()

    def export_state(self, context: list[int]) -> SequenceKV | None:
        with self.lock:
            return self.states.longest_prefix(context) if self.states.capacity_tokens else None

    def import_state(self, state: SequenceKV) -> None:
        with self.lock:
            if self.fingerprint is None:
                raise ValueError("kv state: this engine keeps none (kv_cache_tokens=0)")
            state.check_fits(self.fingerprint, self._version)
            if not self.states.put(state):
                raise ValueError(f"kv state: {len(state)} tokens exceed kv_cache_tokens="
                                 f"{self.states.capacity_tokens}")

    def _keep(self, prior: list[SequenceKV | None], outs: list[Completion],
              finals: list[SequenceKV] | None, stopped_too: bool) -> None:
        """Drop each used state and keep its extension if asked (`finals`); only a sequence
        that ran out of budget will be continued (or, `stopped_too`, an episode's sequence
        after the environment's answer), so only its state is worth the room."""
        for used in prior:
            if used is not None:
                self.tokens_resumed += len(used)
                self.states.pop(used.tokens)
        if finals is None:
            return
        for out, final in zip(outs, finals, strict=True):
            if out.finish_reason == "length" or stopped_too:
                self.states.put(final)

    def stats(self) -> dict[str, float]:
        return {"tokens_generated": self.tokens_generated, "busy_s": self.busy_s,
                "tokens_resumed": self.tokens_resumed}
