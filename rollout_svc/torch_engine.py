"""The compact torch engine: a Hugging Face causal LM sampled with a KV cache."""

from __future__ import annotations

import time

import torch

from relayrl.generation import Completion, sample
from relayrl.models import LoadedModel
from rollout_svc.engine import Engine, SamplingSpec


def check_state_dict(current: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor],
                     version: int) -> None:
    """Refuse a version whose names, shapes or dtypes differ from the model's."""
    missing, extra = set(current) - set(tensors), set(tensors) - set(current)
    if missing or extra:
        raise ValueError(f"version {version}: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(extra)[:5]}")
    for name, t in tensors.items():
        if current[name].shape != t.shape or current[name].dtype != t.dtype:
            raise ValueError(f"version {version}: shard {name} is {t.dtype}{tuple(t.shape)}, "
                             f"model has {current[name].dtype}{tuple(current[name].shape)}")


class TorchEngine(Engine):
    name = "torch"

    def __init__(self, lm: LoadedModel, seed: int = 0, version: int = 0):
        super().__init__()
        self.lm = lm
        self._version = version
        self.generator = torch.Generator().manual_seed(seed)
        self.tokens_generated = 0
        self.busy_s = 0.0

    @property
    def version(self) -> int:
        return self._version

    def generate(self, contexts: list[list[int]], spec: SamplingSpec) -> list[Completion]:
        generator = self.generator
        if spec.seed is not None:
            generator = torch.Generator().manual_seed(spec.seed)
        with self.lock:
            self.use_threads()
            t0 = time.monotonic()
            outs = sample(self.lm.model, contexts, max_new_tokens=spec.max_new_tokens,
                          eos_id=-1 if spec.ignore_eos else self.lm.eos_id,
                          pad_id=self.lm.pad_id,
                          temperature=spec.temperature, greedy=spec.greedy,
                          generator=generator)
            self.busy_s += time.monotonic() - t0
        self.tokens_generated += sum(len(o.tokens) for o in outs)
        return outs

    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        with self.lock:
            self.use_threads()
            check_state_dict(self.lm.model.state_dict(), tensors, version)
            self.lm.model.load_state_dict(tensors, strict=True)
            self._version = version

    def stats(self) -> dict[str, float]:
        return {"tokens_generated": self.tokens_generated, "busy_s": self.busy_s}
