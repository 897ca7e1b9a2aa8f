"""Hugging Face causal LMs: where a run's model is (relayrl_torch.models.cache, no torch import)
and loading it (relayrl_torch.models.loading)."""

from relayrl_torch.models.cache import pretrained_dir, resolve_model_path

__all__ = ["pretrained_dir", "resolve_model_path"]
