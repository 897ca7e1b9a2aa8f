"""The engine interface every generation backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class Generation:
    tokens: list[int]
    logprobs: list[float]  # under the sampling policy, per token
    versions: list[int]  # policy version that produced each token
    finish_reason: str


class Engine(ABC):
    @property
    @abstractmethod
    def version(self) -> int:
        """The policy version the engine currently runs."""

    @abstractmethod
    def generate(self, prompt_tokens: list[int], n: int) -> list[Generation]:
        """n sampled completions of one prompt."""

    @abstractmethod
    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        """Swap in a whole, verified version; never leaves a half-loaded model behind."""
