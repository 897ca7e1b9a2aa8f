"""What things cost, in seconds: one generation worker, migrations, weight syncs, the trainer.

Defaults are one H100 SXM (989 TFLOP/s dense bf16, 3.35 TB/s HBM3: NVIDIA's H100 datasheet)
serving a 7B model in bf16 with grouped-query attention (Qwen2.5-7B: 7.6e9 parameters,
15.2 GB of weights; 28 layers x 4 KV heads x 128 dims x 2 (K, V) x 2 bytes = 57,344 bytes
of KV cache per token), and a trainer built from the same GPUs. Each value says where it
comes from: a published measurement where one was found, otherwise the arithmetic from the
datasheet, said as such. Calibrate the decode terms against a real engine with
`fit_decode_cost` (bench/calibrate_sim.py); see how much each value matters with
relayrl_sim.sensitivity (`relayrl simulate --sensitivity`).
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
    # Streaming 15.2 GB of weights at 3.35 TB/s is 4.5 ms; measured, vLLM decodes Llama-3.1-8B
    # at one request at 75 tokens/s on an A100-40GB, "77% of the memory-bandwidth ceiling"
    # (johnmusgrave.com/p/vllm-throughput-latency-sweep-on), which is 6 ms on an H100 (x2.15
    # the bandwidth).
    decode_fixed_s: float = 6e-3
    # 2 * 7.6e9 FLOP per token at half of bf16 peak; no published per-sequence figure found.
    # Check on the whole: a batch of 128 at ~1,300 tokens of context each then decodes about
    # 9,000 tokens/s, against a reported ~12,500 tokens/s for Llama-3.1-8B bf16 on one H100
    # with vLLM (morphllm.com/vllm-benchmarks, a third-party compilation) and 5,777 tokens/s
    # for MLPerf Inference v5.1's Llama-3.1-8B offline run (FP8, prefill included; Red Hat).
    decode_per_seq_s: float = 3e-5
    decode_per_token_s: float = 2.5e-8  # reading one token's KV (57 KB) at ~2.3 TB/s achieved
    max_batch: int = 128  # sequences decoded together (vLLM's max_num_seqs default is 256)
    kv_budget_tokens: int = 1_000_000  # KV slots left after weights: ~57 GB at 57 KB a token
    # 2 * 7.6e9 FLOP per token at ~40% of bf16 peak; no published prefill rate for a 7B model
    # on an H100 found to cite.
    prefill_per_token_s: float = 4e-5
    # KV transfer between engines (sim.migration `kv`): vLLM's Mooncake connector measured
    # 123 / 202 / 529 ms for 8k / 16k / 32k-token prefixes between two idle instances, about
    # 10 GB/s, falling to ~3 GB/s under decode load, with a flat ~58 ms when overlapped
    # layer by layer (gitea.gahow.org/gahow/agentic-kvc, microbench/connector_tax notes; the
    # model is not named there). Here: 60 ms per move, and 57 KB a token at 10 GB/s.
    migrate_fixed_s: float = 0.06
    migrate_per_token_s: float = 5.7e-6
    # One worker receiving and loading a version (15.2 GB). No published figure for a 7B
    # model found. Moonshot's checkpoint-engine reports updating Kimi-K2 (1T parameters) on
    # thousands of GPUs in ~20 s; this repository's own relay measured 8 workers holding a
    # 2 GB version in 1.68 s through one shared-memory relay (README, weights table), which
    # scales to ~13 s for 15 GB on CPUs. 2 s is 15.2 GB at ~8 GB/s over RDMA: optimistic.
    weight_sync_s: float = 2.0
    train_fixed_s: float = 3.0  # per trainer step: optimizer, snapshot for publishing; a guess
    # torchtitan (docs/performance.md) trains Llama-3.1-8B with FSDP on 8 H100s at 5,762
    # tokens/s/GPU (6,667 with torch.compile): 1.4e-4 s a token for 7.6e9 parameters. RL
    # adds no second forward here (the trainer rescores in the training pass).
    train_per_token_s: float = 1.4e-4
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
