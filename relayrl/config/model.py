"""The policy model, picked by `kind`, each kind with only its own fields and its own limits:

    model: {kind: tiny, hidden_size: 128}                  # the default: built and warm-started
    model: {kind: hf, path: /models/Qwen2.5-0.5B}         # a local Hugging Face directory
    model: {kind: hf, path: Qwen/Qwen2.5-0.5B-Instruct}   # or a hub id (@revision optional)
    model: {kind: pretrained, name: smollm2-135m-instruct} # converted once into cache_dir

A model's limits (vocabulary size, context length) come from its kind without loading it: a
service that checks token ids from outside (the buffer's Submit) needs both numbers but none
of the weights. Nothing here imports torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from relayrl.config.base import StrictModel, foreign_fields
from relayrl.config.task import AdditionTaskConfig

# A hub id, `org/name` or `org/name@revision`, as the hub spells repository names.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}(@[\w./-]{1,128})?")
# What a causal LM needs from its hub repository: no other formats' weights, no images.
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]
# Names config.json gives the context length under, by architecture family.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
_CACHE_DIR = Field(".cache/relayrl/models",
                   description="Where built and converted models are cached.")


@dataclass(frozen=True)
class ModelLimits:
    vocab_size: int  # token ids must be in [0, vocab_size): the embedding's rows
    context_length: int  # most tokens (prompt + response) in one sequence
    source: str  # where the numbers come from, for refusals and logs
    # a mixture of experts' (moe layers, experts, top_k), what routes must fit; dense: 0s
    experts: tuple[int, int, int] = (0, 0, 0)


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
    return ModelLimits(vocab, context, str(path), _experts(scopes))


def _experts(scopes: list[dict]) -> tuple[int, int, int]:
    """(moe layers, experts, top_k) of a config's scopes (its top level, its text_config)."""
    for scope in scopes:
        layers, experts, top_k = expert_layers(scope)
        if layers:
            return len(layers), experts, top_k
    return 0, 0, 0


def expert_layers(config: dict) -> tuple[list[int], int, int]:
    """(the decoder layers that are mixtures of experts, experts per layer, top_k) of a
    Hugging Face config's dict: Qwen-MoE's num_experts and Mixtral's num_local_experts; every
    decoder_sparse_step-th layer not in mlp_only_layers (Qwen), else every layer (Mixtral).
    ([], 0, 0) for a dense model."""
    experts = config.get("num_experts") or config.get("num_local_experts")
    top_k = config.get("num_experts_per_tok")
    layers = config.get("num_hidden_layers")
    if not (isinstance(experts, int) and isinstance(top_k, int) and isinstance(layers, int)
            and experts > 0 and top_k > 0):
        return [], 0, 0
    step = config.get("decoder_sparse_step") or 1
    dense = set(config.get("mlp_only_layers") or [])
    return ([i for i in range(layers) if i not in dense and (i + 1) % step == 0], experts,
            top_k)


DTYPES = ("float32", "bfloat16", "float16")


def read_model_dtype(model_dir: str | Path) -> str:
    """The dtype a Hugging Face directory's config.json names (torch_dtype, or dtype in newer
    files) when it is one the engines take, else float32."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return "float32"
    named = config.get("torch_dtype") or config.get("dtype") if isinstance(config, dict) else None
    return named if named in DTYPES else "float32"


class ModelBase(StrictModel):
    kind: str
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="What the engines load and sample in and the relay stores and "
        "ships (bfloat16: half float32's bytes); the trainer keeps float32 master weights "
        "and publishes in it. auto: the checkpoint's torch_dtype, else float32.")

    def dtype_name(self) -> str:
        """`dtype`, with auto resolved from the model's own config."""
        return self.dtype if self.dtype != "auto" else self._own_dtype()

    def _own_dtype(self) -> str:
        return "float32"

    @classmethod
    def refused_keys(cls, data: dict[str, Any]) -> dict[str, str]:
        """An old key of the model section is refused naming its new place (MOVED), and a
        key this kind lacks naming the kinds that have it."""
        kind = cls.model_fields["kind"].default
        refused = foreign_fields(data, cls, KINDS, "kind", "model")
        for key, (owner, new) in MOVED.items():
            if key in data and not (kind == owner and key == new):
                refused[key] = (f"model.{key} is now model.{new} with model.kind: {owner}, as "
                                f"in `model: {{kind: {owner}, {new}: {data[key]!r}}}`")
        return refused

    def limits(self) -> ModelLimits:
        raise NotImplementedError


class TinyModel(ModelBase):
    """The tiny Llama-architecture model of the addition task (relayrl_torch.models.tiny): its
    tokenizer is the special tokens, then one token per character of the task's alphabet."""

    SPECIALS: ClassVar[tuple[str, ...]] = ("<pad>", "<bos>", "<eos>")
    ALPHABET: ClassVar[str] = AdditionTaskConfig.ALPHABET
    CONTEXT: ClassVar[int] = 256

    kind: Literal["tiny"] = "tiny"
    cache_dir: str = _CACHE_DIR
    hidden_size: int = Field(128, ge=8, le=4096, description="Model width.")
    num_layers: int = Field(4, ge=1, le=48, description="Model depth.")
    num_heads: int = Field(4, ge=1, le=64, description="Attention heads.")
    sft_steps: int = Field(2000, ge=0, le=100_000, description="Most supervised warm-start steps.")
    sft_stop_accuracy: float = Field(
        0.25, ge=0, le=1,
        description="Stop the warm start once held-out sampled accuracy reaches this, so RL "
        "starts from a known point.",
    )
    sft_eval_every: int = Field(50, ge=1, le=100_000, description="Warm-start steps per check.")
    sft_batch_size: int = Field(64, ge=1, le=4096, description="Warm-start batch size.")
    sft_lr: float = Field(1e-3, gt=0, le=1.0, description="Warm-start learning rate.")
    seed: int = Field(0, ge=0, description="Seed of initialisation and warm start.")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads

    def limits(self) -> ModelLimits:
        return ModelLimits(len(self.SPECIALS) + len(set(self.ALPHABET)), self.CONTEXT,
                           "the tiny model (model.kind tiny)")


class HfModel(ModelBase):
    """Any Hugging Face causal LM, from a directory or the hub."""

    kind: Literal["hf"] = "hf"
    path: str = Field(min_length=1, max_length=4096, description="A local Hugging Face "
                      "model directory (config.json, safetensors, tokenizer), or a hub id "
                      "`org/name` (`org/name@revision`), fetched into the Hugging Face cache "
                      "(HF_HOME, HF_HUB_CACHE; HF_HUB_OFFLINE=1 reads the cache only).")

    def limits(self) -> ModelLimits:
        return read_model_limits(self.directory())

    def _own_dtype(self) -> str:
        return read_model_dtype(self.directory())

    def directory(self) -> Path:
        """The model's directory: `path` itself, or the hub snapshot it names (downloaded
        into the cache once; each service that asks finds it there)."""
        if Path(self.path).is_dir() or not HUB_ID.fullmatch(self.path):
            return Path(self.path)
        repo, _, revision = self.path.partition("@")
        from huggingface_hub import snapshot_download  # only for a hub id
        from huggingface_hub.errors import HFValidationError

        try:
            return Path(snapshot_download(repo, revision=revision or None,
                                          allow_patterns=HUB_FILES))
        except (OSError, HFValidationError, ValueError) as err:
            raise ValueError(f"model.path: {self.path!r} is not a directory, and the hub "
                             f"snapshot could not be had ({type(err).__name__}: {err})"
                             ) from None


class PretrainedModel(ModelBase):
    # (vocab_size, max_position_embeddings) of each model's config.json as converted
    # (relayrl_torch.models.smollm2), for a service that starts before the conversion
    KNOWN: ClassVar[dict[str, tuple[int, int]]] = {"smollm2-135m-instruct": (49152, 8192)}

    kind: Literal["pretrained"] = "pretrained"
    name: Literal["smollm2-135m-instruct"] = Field(
        "smollm2-135m-instruct", description="A pretrained model converted once from its PyPI "
        "package into cache_dir (relayrl_torch.models.smollm2).")
    cache_dir: str = _CACHE_DIR

    @property
    def converted_dir(self) -> Path:
        return Path(self.cache_dir) / self.name

    def limits(self) -> ModelLimits:
        if (self.converted_dir / "config.json").is_file():
            return read_model_limits(self.converted_dir)
        vocab, context = self.KNOWN[self.name]
        return ModelLimits(vocab, context, f"model.name {self.name!r}")


ModelConfig = Annotated[TinyModel | HfModel | PretrainedModel, Field(discriminator="kind")]
KINDS: dict[str, type[ModelBase]] = {
    c.model_fields["kind"].default: c for c in (TinyModel, HfModel, PretrainedModel)}

# Keys of the model section before each kind had its own model: old key -> (kind, new key).
MOVED = {"path": ("hf", "path"), "pretrained": ("pretrained", "name")}


def model_shorthand(value: Any) -> Any:
    """A mapping without a kind is the tiny model's (whose old keys ModelBase.refused_keys
    then names)."""
    if not isinstance(value, dict):
        return value
    return value if "kind" in value else {"kind": "tiny", **value}
