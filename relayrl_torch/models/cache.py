"""Where a run's model is on disk: a configured directory, a converted pretrained model, or
the tiny model, built on first use into a directory named by its settings.

Light on purpose: the launcher asks before any service starts, and a cached model must not
cost it a torch import.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from pathlib import Path

from relayrl.config import HfModel, ModelConfig, PretrainedModel, TaskConfig, TinyModel

TINY_BUILD_VERSION = 1  # raise when the tiny model's build changes, so caches are rebuilt


def resolve_model_path(model_cfg: ModelConfig, task_cfg: TaskConfig) -> Path:
    """The configured model directory (or hub snapshot), a converted pretrained model, or the
    cached tiny model (each fetched or built if missing)."""
    if isinstance(model_cfg, HfModel):
        return model_cfg.directory()
    if isinstance(model_cfg, PretrainedModel):
        return pretrained_dir(model_cfg)
    return ensure_tiny_model(model_cfg, task_cfg)


def pretrained_dir(model_cfg: PretrainedModel) -> Path:
    """The pretrained model's converted directory, converted first when it is not there."""
    from relayrl_torch.models.smollm2 import ensure_smollm2  # converts with torch: on demand

    return ensure_smollm2(model_cfg.cache_dir)


def tiny_model_dir(model_cfg: TinyModel, task_cfg: TaskConfig) -> Path:
    spec = {
        "build": TINY_BUILD_VERSION,
        "model": model_cfg.model_dump(exclude={"kind", "cache_dir"}),
        "task": task_cfg.model_dump(),
    }
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return Path(model_cfg.cache_dir) / f"{task_cfg.source}-{key}"


def ensure_tiny_model(model_cfg: TinyModel, task_cfg: TaskConfig) -> Path:
    """The cached tiny model's directory, building it first when it is not there."""
    out = tiny_model_dir(model_cfg, task_cfg)
    if (out / "build_info.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # services started by hand may all ask at once: one builds, the others wait for it
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "build_info.json").is_file():
            return out
        from relayrl_torch.models.tiny import build

        return build(out, model_cfg, task_cfg)
