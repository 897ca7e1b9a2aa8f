"""What things cost, in seconds: one generation worker, migrations, weight syncs, the trainer.

Defaults are loosely one H100 serving a 7B model in bf16 with grouped-query attention
(Qwen2.5-7B: 15 GB of weights, about 57 KB of KV cache per token), and a trainer built from
the same GPUs. Calibrate the decode terms against a real engine with `fit_decode_cost`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class CostParams:
    # decode step = fixed + per_seq * batch + per_token * (context tokens summed over the batch)
    decode_fixed_s: float = 6e-3  # streaming 15 GB of weights at ~2.5 TB/s, plus launches
    decode_per_seq_s: float = 3e-5  # MLP FLOPs and sampling for one more sequence
    decode_per_token_s: float = 2.5e-8  # reading one token's KV (57 KB at ~2.3 TB/s)
    max_batch: int = 128  # sequences decoded together (vLLM's max_num_seqs)
    kv_budget_tokens: int = 1_000_000  # KV cache slots left after weights (~57 GB)
    prefill_per_token_s: float = 4e-5  # 2 * 7.6e9 FLOP per token at ~40% of bf16 peak
    migrate_fixed_s: float = 0.05  # per migration: connect, allocate blocks on the target
    migrate_per_token_s: float = 2.5e-6  # one token's KV over ~25 GB/s RDMA
    weight_sync_s: float = 2.0  # one worker receiving and loading a version (15 GB)
    train_fixed_s: float = 3.0  # per trainer step: optimizer, snapshot for publishing
    train_per_token_s: float = 1e-4  # per token per trainer GPU: 6 * 7.6e9 FLOP at ~45% MFU
    trainer_gpus_per_worker: float = 1.0  # the trainer is sized with the fleet (1:1)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"costs.{f.name} must be a number, got {value!r}")
            if value <= 0 and f.name not in ("decode_per_seq_s", "decode_per_token_s"):
                raise ValueError(f"costs.{f.name} must be > 0, got {value}")
            if value < 0:
                raise ValueError(f"costs.{f.name} must be >= 0, got {value}")
        for name in ("max_batch", "kv_budget_tokens"):
            if int(getattr(self, name)) != getattr(self, name):
                raise ValueError(f"costs.{name} must be an integer, got {getattr(self, name)}")

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        return (self.decode_fixed_s + self.decode_per_seq_s * batch
                + self.decode_per_token_s * context_tokens)

    def migrate_s(self, tokens: int) -> float:
        return self.migrate_fixed_s + self.migrate_per_token_s * tokens

    def train_step_s(self, tokens: int, workers: int) -> float:
        gpus = max(1.0, self.trainer_gpus_per_worker * workers)
        return self.train_fixed_s + self.train_per_token_s * tokens / gpus


def costs_from_mapping(data: Mapping[str, Any]) -> CostParams:
    """A `costs:` section (or a flat mapping of the same fields); unknown keys are refused."""
    if "costs" in data and isinstance(data["costs"], Mapping):
        data = data["costs"]
    known = {f.name for f in dataclasses.fields(CostParams)}
    args = {}
    for key, value in data.items():
        if key not in known:
            raise ValueError(f"costs.{key} is not a cost parameter (known: {sorted(known)})")
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"costs.{key} must be a number, got {value!r}") from None
        args[key] = value
    return CostParams(**args)


def load_costs(path: str | Path) -> CostParams:
    """Cost parameters from a JSON or YAML file (JSON is YAML too)."""
    from relayrl.config.base import read_yaml

    return costs_from_mapping(read_yaml(path))


def save_costs(params: CostParams, path: str | Path) -> None:
    Path(path).write_text(json.dumps(dataclasses.asdict(params), indent=2) + "\n")


def fit_decode_cost(measurements: Iterable[tuple[float, float, float]],
                    base: CostParams | None = None) -> tuple[CostParams, float]:
    """Least-squares fit of decode_fixed_s, decode_per_seq_s, decode_per_token_s to measured
    (batch, context_tokens, seconds) decode steps.

    Residuals are weighted by 1/seconds so small and large batches count alike. Returns the
    fitted parameters (the rest taken from `base`) and the RMS relative error of the fit.
    """
    rows = np.asarray(list(measurements), dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != 3:
        raise ValueError("measurements must be (batch, context_tokens, seconds) tuples")
    if len(rows) < 3:
        raise ValueError(f"measurements: need at least 3 to fit 3 terms, got {len(rows)}")
    if (rows[:, 2] <= 0).any():
        raise ValueError("measurements: seconds must be > 0")
    batch, context, seconds = rows.T
    design = np.stack([np.ones_like(batch), batch, context], axis=1) / seconds[:, None]
    coef, *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    names = ("decode_fixed_s", "decode_per_seq_s", "decode_per_token_s")
    for name, value in zip(names, coef, strict=True):
        if value < 0 or (name == "decode_fixed_s" and value == 0):
            raise ValueError(f"measurements: fitted {name} = {value:.3g} is not physical; "
                             "measure a wider range of batch sizes and contexts")
    params = dataclasses.replace(base or CostParams(),
                                 **{n: float(v) for n, v in zip(names, coef, strict=True)})
    predicted = np.stack([np.ones_like(batch), batch, context], axis=1) @ coef
    rel_error = float(np.sqrt(np.mean(((predicted - seconds) / seconds) ** 2)))
    return params, rel_error
