"""Loading Hugging Face causal LMs and building the tiny task model."""

from relayrl.models.loading import LoadedModel, load_model, resolve_model_path

__all__ = ["LoadedModel", "load_model", "resolve_model_path"]
