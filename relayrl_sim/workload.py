"""The workload: prompt and response lengths, drawn in seeded blocks.

Prompt `p` has samples `p * group_size + j`. Lengths depend only on the seed and the prompt
id, so every mode sees the same prompts with the same responses, whatever order it runs them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from relayrl.config.buffer import BufferConfig

Z99 = 2.3263478740408408  # the standard normal's 99th percentile
KINDS = ("fixed", "uniform", "lognormal")


@dataclass(frozen=True)
class LengthDist:
    """Token lengths: `fixed` (length), `uniform` (low..high inclusive) or `lognormal`
    (median, sigma), every draw clipped to [1, max_len]."""

    kind: str = "fixed"
    length: int = 1024
    low: int = 1
    high: int = 2048
    median: float = 1024.0
    sigma: float = 1.0
    max_len: int = 32768

    def check(self, name: str) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{name}.kind must be one of {KINDS}, got {self.kind!r}")
        if self.max_len < 1:
            raise ValueError(f"{name}.max_len must be >= 1, got {self.max_len}")
        if self.kind == "fixed" and self.length < 1:
            raise ValueError(f"{name}.length must be >= 1, got {self.length}")
        if self.kind == "uniform" and not 1 <= self.low <= self.high:
            raise ValueError(f"{name}.low/high must satisfy 1 <= low <= high, "
                             f"got {self.low}..{self.high}")
        if self.kind == "lognormal" and (self.median < 1 or self.sigma <= 0):
            raise ValueError(f"{name}.median must be >= 1 and {name}.sigma > 0, "
                             f"got {self.median}, {self.sigma}")

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"fixed {self.length}"
        if self.kind == "uniform":
            return f"uniform {self.low}..{self.high}"
        return (f"lognormal median {self.median:g}, p99/median "
                f"{math.exp(self.sigma * Z99):.1f}, max {self.max_len}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            out = np.full(n, self.length, dtype=np.int64)
        elif self.kind == "uniform":
            out = rng.integers(self.low, self.high + 1, size=n)
        else:
            out = np.rint(self.median * np.exp(self.sigma * rng.standard_normal(n)))
        return np.clip(out, 1, self.max_len).astype(np.int64)


def heavy_tail(median: float = 1024.0, p99_over_median: float = 10.0,
               max_len: int = 32768) -> LengthDist:
    """A lognormal whose p99 is `p99_over_median` times its median."""
    return LengthDist("lognormal", median=median, sigma=math.log(p99_over_median) / Z99,
                      max_len=max_len)


RESPONSE_DISTS: dict[str, LengthDist] = {
    "fixed": LengthDist("fixed", length=1024),
    "uniform": LengthDist("uniform", low=256, high=2048),
    "lognormal": LengthDist("lognormal", median=1024.0, sigma=0.5),
    "heavy_tail": heavy_tail(),
}


@dataclass(frozen=True)
class Workload:
    prompt: LengthDist = field(default_factory=lambda: LengthDist("uniform", low=64, high=512))
    response: LengthDist = field(default_factory=heavy_tail)
    # samples per prompt (a GRPO group): buffer.group_size's default
    group_size: int = BufferConfig.model_fields["group_size"].default
    groups_per_worker: int = 16  # trainer batch = workers * groups_per_worker groups
    seed: int = 0

    def __post_init__(self) -> None:
        self.prompt.check("workload.prompt")
        self.response.check("workload.response")
        if self.group_size < 1:
            raise ValueError(f"workload.group_size must be >= 1, got {self.group_size}")
        if self.groups_per_worker < 1:
            raise ValueError(f"workload.groups_per_worker must be >= 1, "
                             f"got {self.groups_per_worker}")


def workload_from_mapping(data: Mapping[str, Any], **overrides: Any) -> Workload:
    """A `workload:` section; `prompt` and `response` may name a preset (`heavy_tail`) or be
    a mapping: LengthDist's fields, or `kind: heavy_tail` with median, p99_over_median and
    max_len."""
    known = {f.name for f in fields(Workload)}
    args: dict[str, Any] = {}
    for key, value in {**data, **overrides}.items():
        if key not in known:
            raise ValueError(f"workload.{key} is not a workload field (known: {sorted(known)})")
        if key in ("prompt", "response"):
            value = _dist(f"workload.{key}", value)
        args[key] = value
    return Workload(**args)


def _dist(name: str, value: Any) -> LengthDist:
    if isinstance(value, LengthDist):
        return value
    if isinstance(value, str):
        if value not in RESPONSE_DISTS:
            raise ValueError(f"{name} must be one of {sorted(RESPONSE_DISTS)} or a mapping, "
                             f"got {value!r}")
        return RESPONSE_DISTS[value]
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a preset name or a mapping, got {value!r}")
    if value.get("kind") == "heavy_tail":
        args = {k: v for k, v in value.items() if k != "kind"}
        for key in args:
            if key not in ("median", "p99_over_median", "max_len"):
                raise ValueError(f"{name}.{key} is not a heavy_tail field "
                                 "(known: max_len, median, p99_over_median)")
        return heavy_tail(**args)
    known = {f.name for f in fields(LengthDist)}
    for key in value:
        if key not in known:
            raise ValueError(f"{name}.{key} is not a length field (known: {sorted(known)})")
    return LengthDist(**value)


class Lengths:
    """Prompt and response lengths by id, grown in blocks as the simulation asks for more."""

    BLOCK = 1024  # prompts per block

    def __init__(self, workload: Workload):
        self.workload = workload
        self.prompt: list[int] = []  # by prompt id
        self.response: list[int] = []  # by sample id

    def ensure(self, prompts: int) -> None:
        wl = self.workload
        while len(self.prompt) < prompts:
            rng = np.random.default_rng([wl.seed, len(self.prompt) // self.BLOCK])
            self.prompt.extend(wl.prompt.sample(rng, self.BLOCK).tolist())
            self.response.extend(wl.response.sample(rng, self.BLOCK * wl.group_size).tolist())
