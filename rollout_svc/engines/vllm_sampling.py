"""How a SamplingSpec maps onto vLLM's sampling, and a vLLM output back to a Completion.

Log-probabilities. vLLM runs with `logprobs_mode="processed_logprobs"`: the logprob it returns
for a sampled token is taken from the distribution it sampled from, after temperature (raw
mode would give the temperature-1 distribution). Greedy requests skip temperature in vLLM (in
both its model runners), so a small logits processor divides their logits by the spec's
temperature first: argmax does not change, and the recorded logprobs are those at the spec
temperature, as the torch engine records them. vLLM's two model runners load processors of
two interfaces, and each refuses the other's, so there is one class per runner; the engine
asks vLLM which runner it will use (rollout_svc.engines.vllm), and
tests/unit/test_vllm_processors.py runs vLLM's own loaders on both.

Seeds. Unseeded requests draw from the engine's own stream (seeded at start); a seeded call
gives each of its requests a seed drawn from the call's. vLLM is imported only by the
functions that need it, after rollout_svc.engines.vllm has set its environment.
tests/integration/test_vllm_engine.py exercises both directions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from relayrl.config.rollout import MAX_TEMPERATURE, MIN_TEMPERATURE
from relayrl_torch.sampling.sampler import Completion
from rollout_svc.engines.api import SamplingSpec

GREEDY_TEMPERATURE_KEY = "relayrl_greedy_temperature"

_processors: dict[bool, type] = {}


def greedy_temperature_processor(v2: bool) -> type:
    """The logits processor that divides a greedy request's logits by the temperature in its
    extra_args, so its processed logprobs are those at that temperature, written to the
    interface of the model runner vLLM runs: `v2`, its V2 runner (every machine where Triton
    works, so every CUDA machine), whose loader refuses any other class; else the V1 runner
    (vLLM's CPU build). Argmax does not change, so the greedy pick is the same."""
    if v2 not in _processors:
        _processors[v2] = _v2_processor() if v2 else _v1_processor()
    return _processors[v2]


def greedy_temperature(params: Any) -> float | None:
    """The temperature a request's greedy logits are divided by; None for any other request.
    ValueError naming the field for a value outside what RelayRL samples at."""
    value = (params.extra_args or {}).get(GREEDY_TEMPERATURE_KEY)
    if value is None:
        return None
    if isinstance(value, bool) or not (isinstance(value, (int, float))
                                       and MIN_TEMPERATURE <= value <= MAX_TEMPERATURE):
        raise ValueError(f"extra_args.{GREEDY_TEMPERATURE_KEY}: {value!r} is not a temperature "
                         f"in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]")
    return float(value)


def _v1_processor() -> type:
    from vllm.v1.sample.logits_processor import LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates

    class GreedyTemperatureV1(LogitsProcessor):
        """vLLM's V1 interface: state keyed by the batch row, kept by `update_state`."""

        def __init__(self, vllm_config, device, is_pin_memory):
            self.temperatures: dict[int, float] = {}

        @classmethod
        def validate_params(cls, sampling_params) -> None:
            greedy_temperature(sampling_params)

        def is_argmax_invariant(self) -> bool:
            # it is, but only processors declared otherwise run before a greedy pick
            return False

        def update_state(self, batch_update) -> None:
            process_dict_updates(self.temperatures, batch_update,
                                 lambda params, _, __: greedy_temperature(params))

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            if self.temperatures:
                rows = torch.tensor(list(self.temperatures), device=logits.device)
                temps = torch.tensor(list(self.temperatures.values()), dtype=logits.dtype,
                                     device=logits.device)
                logits[rows] = logits[rows] / temps[:, None]
            return logits

    return GreedyTemperatureV1


def _v2_processor() -> type:
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor

    class GreedyTemperatureV2(LogitsProcessor):
        """vLLM's V2 interface: state keyed by the request's persistent slot, set in
        `add_request`, flushed to the device once a step, applied before vLLM's own
        temperature (which skips greedy rows) to every logits row of a greedy slot."""

        def __init__(self, vllm_config, req_states):
            self.divisors = np.ones(req_states.max_num_reqs, dtype=np.float32)  # 1: unchanged
            self.on_device = torch.ones(req_states.max_num_reqs, dtype=torch.float32,
                                        device=req_states.device)
            self.changed = False

        @classmethod
        def validate_params(cls, sampling_params) -> None:
            greedy_temperature(sampling_params)

        def add_request(self, req_idx: int, sampling_params) -> bool:
            temperature = greedy_temperature(sampling_params)
            divisor = 1.0 if temperature is None else temperature
            if self.divisors[req_idx] != divisor:  # a recycled slot is overwritten whole
                self.divisors[req_idx] = divisor
                self.changed = True
            return temperature is not None

        def apply_staged_writes(self) -> None:
            if self.changed:
                self.on_device.copy_(torch.from_numpy(self.divisors))
                self.changed = False

        def apply(self, logits: torch.Tensor, ctx) -> torch.Tensor:
            if np.all(self.divisors[ctx.idx_mapping_np] == 1.0):
                return logits
            # dividing the other rows by 1.0 leaves them exactly as they were
            return logits.div_(self.on_device[ctx.expanded_idx_mapping].unsqueeze(1))

    return GreedyTemperatureV2


def sampling_params(params_cls: Any, spec: SamplingSpec, contexts: list[list[int]],
                    max_model_len: int, eos_ids: Sequence[int]) -> list[Any]:
    """One vLLM `params_cls` (SamplingParams) per context."""
    # Unseeded requests draw from the engine's own stream (seeded at start): a per-request
    # seed gives each request a generator of its own, slower, and on CPU it fails when a
    # batch is split part way through a prompt.
    if spec.greedy or spec.seed is None:
        seeds: list[int | None] = [None] * len(contexts)
    else:
        rng = np.random.default_rng(spec.seed)
        seeds = [int(s) for s in rng.integers(0, 1 << 62, size=len(contexts))]
    structured = None
    if spec.structured:  # vLLM's structured outputs (its default backend, xgrammar)
        from vllm.sampling_params import StructuredOutputsParams

        structured = StructuredOutputsParams(**json.loads(spec.structured))
    params = []
    for ctx, seed in zip(contexts, seeds, strict=True):
        params.append(params_cls(
            max_tokens=min(spec.max_new_tokens, max_model_len - len(ctx)),
            temperature=0.0 if spec.greedy else spec.temperature,
            seed=seed, logprobs=spec.top_logprobs, ignore_eos=spec.ignore_eos,
            # vLLM matches stop strings on its detokenized text, so only then detokenizes
            stop=list(spec.stop) or None, detokenize=bool(spec.stop),
            stop_token_ids=[] if spec.ignore_eos else list(eos_ids),
            extra_args={GREEDY_TEMPERATURE_KEY: spec.temperature} if spec.greedy else None,
            **({"structured_outputs": structured} if structured is not None else {}),
        ))
    return params


def completion(out: Any, top_logprobs: int = 0, expert_layers: list[int] | None = None
               ) -> Completion:
    """A vLLM CompletionOutput as a Completion, with the sampled tokens' logprobs (and each
    position's `top_logprobs` most likely tokens: those vLLM ranks 1..top_logprobs; it adds
    the sampled token, of whatever rank). A stop string that ended it is its stop_reason (an
    id of stop_token_ids, an end of sequence, is not). With `expert_layers` (the decoder
    layers that have experts), its routed_experts ([positions fed, every decoder layer,
    top_k]) become its routes: [those layers, positions, top_k]."""
    tokens = list(out.token_ids)
    if out.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM finished a request with {out.finish_reason!r}")
    positions = [out.logprobs[i] for i in range(len(tokens))]
    logprobs = [float(p[t].logprob) for p, t in zip(positions, tokens, strict=True)]
    top = None
    if top_logprobs:
        top = [sorted(((int(t), float(lp.logprob)) for t, lp in p.items()
                       if lp.rank is not None and lp.rank <= top_logprobs),
                      key=lambda pair: -pair[1]) for p in positions]
    stop = out.stop_reason if isinstance(out.stop_reason, str) else None
    routes = None
    if expert_layers is not None and out.routed_experts is not None:
        picked = np.asarray(out.routed_experts)[:, expert_layers].transpose(1, 0, 2)
        routes = np.ascontiguousarray(picked.astype(np.int16 if picked.max(initial=0) > 255
                                                    else np.uint8))
    return Completion(tokens=tokens, logprobs=logprobs, finish_reason=out.finish_reason,
                      stop_reason=stop, top_logprobs=top, routes=routes)
