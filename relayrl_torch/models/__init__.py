"""Hugging Face causal LMs: where a run's model is (relayrl_torch.models.cache, no torch import)
and loading it (relayrl_torch.models.loading)."""

from relayrl_torch.models.cache import load_run_task, resolve_model_path, tokenizer_dir

__all__ = ["load_run_task", "resolve_model_path", "tokenizer_dir"]
