"""Load any Hugging Face causal LM (config, safetensors, tokenizer.json) from a directory."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch import nn

from relayrl.config import ConfigError
from relayrl.plugins.chat import Schema, encode_chat, encode_problem, encode_text


@dataclass
class LoadedModel:
    model: Any  # transformers PreTrainedModel; None when only the tokenizer was loaded
    tokenizer: Any  # transformers PreTrainedTokenizerBase
    path: Path

    @property
    def eos_id(self) -> int:
        """The tokenizer's end of sequence: what a response the trainer builds ends with."""
        return int(self.tokenizer.eos_token_id)

    @cached_property
    def eos_ids(self) -> tuple[int, ...]:
        """Every token id that ends a sampled response (eos_ids)."""
        return eos_ids(self.path, self.tokenizer.eos_token_id)

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    def encode_prompt(self, text: str) -> list[int]:
        return encode_text(self.tokenizer, text)

    def encode_chat(self, messages: list[dict], tools: Sequence[Schema] | None = None
                    ) -> list[int]:
        return encode_chat(self.tokenizer, messages, tools)

    def encode_problem(self, text: str, messages: Sequence[Mapping[str, str]] = ()
                       ) -> list[int]:
        return encode_problem(self.tokenizer, text, messages)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def eos_ids(model_dir: str | Path, tokenizer_eos: int | None = None) -> tuple[int, ...]:
    """Every token id that ends a response: the tokenizer's end of sequence first, then the
    ids of the directory's generation_config.json and config.json (each an id or a list of
    them). A chat model often ends its turn with a token of its own (`<|eot_id|>`,
    `<|im_end|>`, `<end_of_turn>`) that only generation_config names."""
    found = [] if tokenizer_eos is None else [int(tokenizer_eos)]
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((Path(model_dir) / name).read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                found.append(item)
    return tuple(dict.fromkeys(found))


def load_model(path: str | Path, dtype: torch.dtype | str = torch.float32,
               weights: bool = True, meta: bool = False) -> LoadedModel:
    """The directory's tokenizer and model, its weights in `dtype`; without `weights`, the
    tokenizer alone (model None): a process whose engine loads the weights itself (vLLM)
    holds no second copy. With `meta`, the model is built from its config and no weight is
    read: every parameter is on the meta device (a shape and a dtype, no storage) and every
    buffer as the model's constructor computes it (rotary frequencies are in no checkpoint).
    A trainer rank under torchrun shards it, then reads its own slices
    (trainer_svc.distributed)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"model.path: {path} holds no config.json")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = None
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if weights and meta:
        with parameters_on_meta():
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path),
                                                     dtype=dtype)
        with contextlib.suppress(OSError):  # as from_pretrained: else the config's defaults
            model.generation_config = GenerationConfig.from_pretrained(path)
    elif weights:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if model is not None:
        model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, path=path)


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside hold their parameters on the meta device and their buffers as
    built. A parameter set again (a tied output projection, set to the input embedding) stays
    the one object it was, so the tie holds."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register
