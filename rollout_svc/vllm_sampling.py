"""How a SamplingSpec maps onto vLLM's sampling, and a vLLM output back to a Completion.

Log-probabilities. vLLM runs with `logprobs_mode="processed_logprobs"`: the logprob it returns
for a sampled token is taken from the distribution it sampled from, after temperature (raw
mode would give the temperature-1 distribution). Greedy requests skip temperature in vLLM, so a
small logits processor divides their logits by the spec's temperature first: argmax does not
change, and the recorded logprobs are those at the spec temperature, as the torch engine
records them.

Seeds. Unseeded requests draw from the engine's own stream (seeded at start); a seeded call
gives each of its requests a seed drawn from the call's. vLLM is imported only by the
functions that need it, after rollout_svc.vllm_engine has set its environment.
tests/integration/test_vllm_engine.py exercises both directions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from relayrl_torch.sampling.sampler import Completion
from rollout_svc.engine_api import SamplingSpec

GREEDY_TEMPERATURE_KEY = "relayrl_greedy_temperature"

_processor_cls: type | None = None


def greedy_temperature_processor() -> type:
    """A vLLM logits processor that divides a greedy request's logits by the temperature
    in its extra_args, so its processed logprobs are those at that temperature."""
    global _processor_cls
    if _processor_cls is not None:
        return _processor_cls
    from vllm.v1.sample.logits_processor import LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates

    class GreedyTemperature(LogitsProcessor):
        def __init__(self, vllm_config, device, is_pin_memory):
            self.temperatures: dict[int, float] = {}

        def is_argmax_invariant(self) -> bool:
            # it is, but only processors declared otherwise run before a greedy pick
            return False

        def update_state(self, batch_update) -> None:
            process_dict_updates(
                self.temperatures, batch_update,
                lambda params, _, __: (params.extra_args or {}).get(GREEDY_TEMPERATURE_KEY),
            )

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            if self.temperatures:
                rows = torch.tensor(list(self.temperatures), device=logits.device)
                temps = torch.tensor(list(self.temperatures.values()), dtype=logits.dtype,
                                     device=logits.device)
                logits[rows] = logits[rows] / temps[:, None]
            return logits

    _processor_cls = GreedyTemperature
    return _processor_cls


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
    params = []
    for ctx, seed in zip(contexts, seeds, strict=True):
        params.append(params_cls(
            max_tokens=min(spec.max_new_tokens, max_model_len - len(ctx)),
            temperature=0.0 if spec.greedy else spec.temperature,
            seed=seed, logprobs=0, detokenize=False, ignore_eos=spec.ignore_eos,
            stop_token_ids=[] if spec.ignore_eos else list(eos_ids),
            extra_args={GREEDY_TEMPERATURE_KEY: spec.temperature} if spec.greedy else None,
        ))
    return params


def completion(out: Any) -> Completion:
    """A vLLM CompletionOutput as a Completion, with the sampled tokens' logprobs."""
    tokens = list(out.token_ids)
    if out.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM finished a request with {out.finish_reason!r}")
    logprobs = [float(out.logprobs[i][t].logprob) for i, t in enumerate(tokens)]
    return Completion(tokens=tokens, logprobs=logprobs, finish_reason=out.finish_reason)
