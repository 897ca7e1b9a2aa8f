"""The compact torch engine: a Hugging Face causal LM sampled with a KV cache."""

from __future__ import annotations

import torch

from relayrl.config import RolloutConfig
from relayrl.generation import sample
from relayrl.models import LoadedModel
from rollout_svc.engine import Engine, Generation


class TorchEngine(Engine):
    def __init__(self, lm: LoadedModel, cfg: RolloutConfig, version: int = 0):
        self.lm = lm
        self.cfg = cfg
        self._version = version
        self.generator = torch.Generator().manual_seed(cfg.seed * 1000 + cfg.worker_index)

    @property
    def version(self) -> int:
        return self._version

    def generate(self, prompt_tokens: list[int], n: int) -> list[Generation]:
        outs = sample(
            self.lm.model, [prompt_tokens] * n, max_new_tokens=self.cfg.max_new_tokens,
            eos_id=self.lm.eos_id, pad_id=self.lm.pad_id, temperature=self.cfg.temperature,
            generator=self.generator,
        )
        return [Generation(o.tokens, o.logprobs, [self._version] * len(o.tokens), o.finish_reason)
                for o in outs]

    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        current = self.lm.model.state_dict()
        missing, extra = set(current) - set(tensors), set(tensors) - set(current)
        if missing or extra:
            raise ValueError(f"version {version}: missing {sorted(missing)[:5]}, "
                             f"unexpected {sorted(extra)[:5]}")
        for name, t in tensors.items():
            if current[name].shape != t.shape or current[name].dtype != t.dtype:
                raise ValueError(f"version {version}: shard {name} is {t.dtype}{tuple(t.shape)}, "
                                 f"model has {current[name].dtype}{tuple(current[name].shape)}")
        # every check passed before the first byte changes: the swap cannot stop half-way
        self.lm.model.load_state_dict(tensors, strict=True)
        self._version = version
