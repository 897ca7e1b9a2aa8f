"""A task from its config: the addition example, a dataset, or a reasoning-gym generator."""

from __future__ import annotations

from typing import Protocol

from relayrl.config import ConfigError, HfModel, RunConfig, TaskConfig
from relayrl.plugins.tasks.addition import AdditionTask
from relayrl.plugins.tasks.dataset import DatasetTask, PromptLimit
from relayrl.plugins.tasks.problem import Problem


class Task(Protocol):
    reward_name: str

    def problem(self, prompt_id: int) -> Problem:
        """Training problem `prompt_id` (>= 0): the same problem for the same id, always."""

    def eval_problems(self) -> list[Problem]:
        """The held-out problems (ids -1, -2, ...), never among the training ones."""


def reward_spec(cfg: TaskConfig) -> str:
    """The reward a task is scored with, without building the task (no data is read)."""
    if cfg.source == "addition":
        return cfg.reward or ("exact_match" if cfg.prompt_format == "raw" else "math_verify")
    if cfg.source == "reasoning_gym":
        return cfg.reward or "reasoning_gym"
    return cfg.reward


def check_reward(cfg: TaskConfig) -> str:
    """reward_spec(cfg), resolved once so a bad spec fails at start-up naming task.reward."""
    from relayrl.plugins.rewards import get_reward

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
    from relayrl.plugins.tasks.reasoning_gym import ReasoningGymTask

    return ReasoningGymTask(cfg, limit)


def make_run_task(cfg: RunConfig) -> Task:
    """The run's task, its rows checked against the longest prompt the rollout takes
    (measured with the run's tokenizer where model.kind is hf)."""
    if cfg.task.source == "addition" or not isinstance(cfg.model, HfModel):
        return make_task(cfg.task)
    from transformers import AutoTokenizer

    from relayrl.models.loading import encode_problem

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    room = cfg.model.limits().context_length - cfg.rollout.max_new_tokens
    limit = PromptLimit(lambda text, messages: len(encode_problem(tokenizer, text, messages)),
                        min(cfg.rollout.max_prompt_tokens, room))
    return make_task(cfg.task, limit)
