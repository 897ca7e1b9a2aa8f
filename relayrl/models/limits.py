"""The policy model's vocabulary size and context length, learned without loading it.

A service that checks token ids from outside (the buffer's Submit) needs both numbers but
none of the weights, so they come from the model's config.json, or, for a model the
trainer and workers build or convert themselves at start-up (the tiny task model, a
pretrained model not yet converted), from the run config that determines them. Nothing here
imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from relayrl.config import ModelConfig, TaskConfig

# The tiny task model (relayrl.models.tiny builds it from these): its special tokens, then
# one token per character of the task's alphabet; its context is fixed.
TINY_SPECIALS = ("<pad>", "<bos>", "<eos>")
TINY_CONTEXT = 256

# Pretrained models as converted (relayrl.models.smollm2), for a service that starts before
# the conversion: (vocab_size, max_position_embeddings) of their config.json.
PRETRAINED = {"smollm2-135m-instruct": (49152, 8192)}

# Names config.json gives the context length under, by architecture family.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


@dataclass(frozen=True)
class ModelLimits:
    vocab_size: int  # token ids must be in [0, vocab_size): the embedding's rows
    context_length: int  # most tokens (prompt + response) in one sequence
    source: str  # where the numbers come from, for refusals and logs


def tiny_vocab_size(alphabet: str) -> int:
    return len(TINY_SPECIALS) + len(set(alphabet))


def read_model_limits(model_dir: str | Path) -> ModelLimits:
    """The limits in a Hugging Face model directory's config.json (a multimodal model's
    text_config holds them when the top level does not)."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"model.path: cannot read {path}: {err}") from None
    if not isinstance(config, dict):
        raise ValueError(f"model.path: {path} does not hold a JSON object")
    scopes = [config, config.get("text_config") or {}]
    vocab = next((s["vocab_size"] for s in scopes if isinstance(s.get("vocab_size"), int)), 0)
    context = next((s[k] for s in scopes for k in _CONTEXT_KEYS if isinstance(s.get(k), int)),
                   0)
    if vocab < 1 or context < 1:
        raise ValueError(f"model.path: {path} gives no positive vocab_size and context length "
                         f"(one of {list(_CONTEXT_KEYS)})")
    return ModelLimits(vocab, context, str(path))


def model_limits(model: ModelConfig, task: TaskConfig) -> ModelLimits:
    """The limits of the model the run trains: model.path's config.json (what `relayrl up`
    gives every service once it has prepared the model), else the model the config names."""
    if model.path:
        return read_model_limits(model.path)
    if model.pretrained:
        converted = Path(model.cache_dir) / model.pretrained
        if (converted / "config.json").is_file():
            return read_model_limits(converted)
        vocab, context = PRETRAINED[model.pretrained]
        return ModelLimits(vocab, context, f"model.pretrained {model.pretrained!r}")
    from relayrl.plugins.tasks import AdditionTask

    return ModelLimits(tiny_vocab_size(AdditionTask.alphabet), TINY_CONTEXT,
                       f"the tiny {task.source} model (model.path unset)")
