"""Build the generation engine a run's config names."""

from __future__ import annotations

from pathlib import Path

from relayrl.config import ConfigError, RunConfig
from relayrl.models.loading import LoadedModel
from relayrl.runtime.devices import resolve_device
from rollout_svc.engine_api import Engine
from rollout_svc.torch_engine import TorchEngine


def make_engine(cfg: RunConfig, lm: LoadedModel, model_path: str | Path) -> Engine:
    """The torch engine over the loaded model, on rollout.device, or a vLLM engine over the
    same directory (imported only then: vLLM is an optional dependency)."""
    r = cfg.rollout
    seed = r.seed * 1000 + r.worker_index
    if r.engine == "torch":
        return TorchEngine(lm, seed=seed, kv_cache_tokens=r.kv_cache_tokens,
                           device=resolve_device(r.device, "rollout.device"))
    if r.engine == "vllm":
        from rollout_svc.vllm_engine import VllmEngine

        return VllmEngine(model_path, seed=seed, eos_id=lm.eos_id,
                          kv_cache_gib=r.vllm_kv_cache_gib, max_model_len=r.vllm_max_model_len,
                          dtype=r.vllm_dtype, enforce_eager=r.vllm_enforce_eager,
                          gpu_memory_utilization=r.vllm_gpu_memory_utilization,
                          tensor_parallel_size=r.vllm_tensor_parallel_size,
                          kv_transfer_port=(r.kv_transfer_base_port + r.worker_index
                                            if r.kv_transfer_base_port else 0))
    raise ConfigError(f"rollout.engine: unknown engine {r.engine!r}")
