"""Load any Hugging Face causal LM (config, safetensors, tokenizer.json) from a directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from relayrl.config import ModelConfig, TaskConfig


@dataclass
class LoadedModel:
    model: Any  # transformers PreTrainedModel
    tokenizer: Any  # transformers PreTrainedTokenizerBase
    path: Path

    @property
    def eos_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    def encode_prompt(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        bos = self.tokenizer.bos_token_id
        return ([bos] if bos is not None else []) + list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"model.path: {path} holds no config.json")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, path=path)


def resolve_model_path(model_cfg: ModelConfig, task_cfg: TaskConfig) -> Path:
    """The configured model directory, or the cached tiny model (built if missing)."""
    if model_cfg.path:
        return Path(model_cfg.path)
    from relayrl.models.tiny import ensure_tiny_model

    return ensure_tiny_model(model_cfg, task_cfg)
