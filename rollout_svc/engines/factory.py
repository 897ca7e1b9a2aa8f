"""Build the generation engine a run's config names."""

from __future__ import annotations

from pathlib import Path

from relayrl.config import ConfigError, ModelConfig, RolloutRun, TorchEngineConfig
from relayrl.config.rollout import EngineConfig
from relayrl_torch.devices import resolve_device
from relayrl_torch.models.loading import LoadedModel
from relayrl_torch.models.lora import with_lora
from rollout_svc.engines.api import Engine
from rollout_svc.engines.torch import TorchEngine


def vllm_dtype(e: EngineConfig, model: ModelConfig) -> str:
    """The dtype a vLLM engine `e` loads and samples in: model.dtype's, which versions are
    shipped in (read from the model's config for auto); a rollout.engine.dtype naming
    another is refused. `relayrl check` calls it too."""
    shipped = model.dtype_name()
    if getattr(e, "dtype", "auto") not in ("auto", shipped):
        raise ConfigError(f"rollout.engine.dtype {e.dtype!r} differs from model.dtype "
                          f"{shipped!r}, the dtype versions are shipped in; set one of them "
                          "to the other (or rollout.engine.dtype auto)")
    return shipped


def make_engine(cfg: RolloutRun, lm: LoadedModel, model_path: str | Path) -> Engine:
    """The torch engine over the loaded model, on rollout.engine.device, or a vLLM engine over
    the same directory (imported only then: vLLM is an optional dependency)."""
    r, e = cfg.rollout, cfg.rollout.engine
    seed = r.seed * 1000 + r.worker_index
    if isinstance(e, TorchEngineConfig):
        if cfg.lora is not None:  # the trainer's adapter, applied version by version
            lm.model = with_lora(lm.model, cfg.lora)
        return TorchEngine(lm, seed=seed, kv_cache_tokens=e.kv_cache_tokens,
                           device=resolve_device(e.device, "rollout.engine.device"),
                           record_routes=cfg.routing_replay)
    from rollout_svc.engines.vllm import VllmEngine

    shipped = vllm_dtype(e, cfg.model)
    return VllmEngine(model_path, seed=seed, eos_ids=lm.eos_ids,
                      kv_cache_gib=e.kv_cache_gib, max_model_len=e.max_model_len,
                      dtype=shipped, enforce_eager=e.enforce_eager,
                      gpu_memory_utilization=e.gpu_memory_utilization,
                      tensor_parallel_size=e.tensor_parallel_size,
                      kv_transfer_port=(e.kv_transfer_base_port + r.worker_index
                                        if e.kv_transfer_base_port else 0),
                      # other engines dial its side channel where they dial the worker
                      kv_transfer_host=r.host if r.endpoint.dialable else "localhost",
                      port_range=e.port_range, lora=cfg.lora,
                      lora_serving=e.lora_serving,
                      weight_transfer=cfg.vllm_transfer,
                      routed_experts=cfg.routing_replay)
