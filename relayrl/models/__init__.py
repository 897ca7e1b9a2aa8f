"""Hugging Face causal LMs: where a run's model is (relayrl.models.cache, no torch import)
and loading it (relayrl.models.loading)."""

from relayrl.models.cache import resolve_model_path

__all__ = ["resolve_model_path"]
