"""Task lookup by config name."""

from __future__ import annotations

from relayrl.config import TaskConfig
from relayrl.tasks.addition import AdditionTask


def make_task(cfg: TaskConfig) -> AdditionTask:
    if cfg.name != "addition":
        raise ValueError(f"task.name: unknown task {cfg.name!r}")
    task = AdditionTask(digits=cfg.digits, seed=cfg.seed, eval_size=cfg.eval_size,
                        prompt_format=cfg.prompt_format, reward=cfg.reward)
    from relayrl.rewards import get_reward

    try:
        get_reward(task.reward_name)
    except ValueError as err:
        raise ValueError(f"task.reward: {err}") from None
    return task
