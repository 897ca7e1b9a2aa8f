"""A task from its config: the addition example, a dataset, a reasoning-gym generator, or a
verifiers environment's dataset; the run's task, its prompts measured, is
relayrl_tasks.tasks.run_task's."""

from __future__ import annotations

from relayrl.config import ConfigError, TaskConfig
from relayrl.plugins.tasks import Task
from relayrl_tasks.tasks.addition import AdditionTask
from relayrl_tasks.tasks.dataset import DatasetTask, PromptLimit


def reward_spec(cfg: TaskConfig) -> str:
    """The reward a task is scored with, without building the task (no data is read)."""
    if cfg.source == "addition":
        return cfg.reward or ("exact_match" if cfg.prompt_format == "raw" else "math_verify")
    if cfg.source == "reasoning_gym":
        return cfg.reward or "reasoning_gym"
    return cfg.reward  # dataset, verifiers


def check_reward(cfg: TaskConfig) -> str:
    """reward_spec(cfg), resolved once so a bad spec fails at start-up naming task.reward."""
    from relayrl_tasks.rewards import get_reward

    spec = reward_spec(cfg)
    try:
        get_reward(spec)
    except ValueError as err:
        raise ConfigError(f"task.reward: {err}") from None
    return spec


def make_task(cfg: TaskConfig, limit: PromptLimit | None = None) -> Task:
    """`limit`: the longest prompt the rollout takes, and how to count a prompt's tokens;
    dataset rows over it are skipped (task.long_prompts)."""
    check_reward(cfg)
    if cfg.source == "addition":
        return AdditionTask(digits=cfg.digits, seed=cfg.seed, eval_size=cfg.eval_size,
                            prompt_format=cfg.prompt_format, reward=cfg.reward)
    if cfg.source == "dataset":
        return DatasetTask(cfg, limit)
    if cfg.source == "verifiers":
        from relayrl_tasks.tasks.verifiers_task import verifiers_task

        return verifiers_task(cfg, limit)
    from relayrl_tasks.tasks.reasoning_gym import ReasoningGymTask

    return ReasoningGymTask(cfg, limit)
