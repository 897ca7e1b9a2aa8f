"""Task lookup by config name."""

from __future__ import annotations

from relayrl.config import TaskConfig
from relayrl.tasks.addition import AdditionTask


def make_task(cfg: TaskConfig) -> AdditionTask:
    if cfg.name == "addition":
        return AdditionTask(digits=cfg.digits, seed=cfg.seed, eval_size=cfg.eval_size)
    raise ValueError(f"task.name: unknown task {cfg.name!r}")
