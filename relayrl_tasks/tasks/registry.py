"""A task from its config: the addition example, a dataset, a reasoning-gym generator, or a
verifiers environment's dataset."""

from __future__ import annotations

from pathlib import Path

from relayrl.config import ConfigError, RunConfig, TaskConfig, TinyModel
from relayrl.plugins.chat import encode_problem
from relayrl.plugins.tasks import Task
from relayrl_tasks.tasks.addition import AdditionTask
from relayrl_tasks.tasks.dataset import DatasetTask, PromptLimit, PromptTokens


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


def prompt_limit(cfg: RunConfig, model_dir: Path | None) -> PromptLimit | None:
    """The longest prompt the run's engine takes (RunConfig.prompt_window) and how a prompt is
    counted there (prompt_counter). None for the addition task, whose short prompts are not
    read from anywhere."""
    if cfg.task.source == "addition" or isinstance(cfg.model, TinyModel):
        return None
    window = cfg.prompt_window()
    if window.longest < 1:
        raise ConfigError(f"rollout.max_new_tokens: {window.max_new_tokens} leaves no room for "
                          f"a prompt in {window.engine_source} ({window.engine} tokens)")
    return PromptLimit(prompt_counter(cfg, model_dir), window.longest, window.describe())


def prompt_counter(cfg: RunConfig, model_dir: Path | None) -> PromptTokens | None:
    """A prompt's length in tokens as the run's workers lay it out: the tokenizer in
    `model_dir` (the run's model directory), the chat template applied as a worker applies
    it. None for the tiny model."""
    if isinstance(cfg.model, TinyModel):
        return None
    assert model_dir is not None, "a model other than the tiny one has a directory"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return lambda text, messages: len(encode_problem(tokenizer, text, messages))


def make_run_task(cfg: RunConfig, model_dir: Path | None) -> Task:
    """The run's task, every prompt it reads measured once, chat template applied, against the
    longest prompt the configured engine takes (prompt_limit); task.long_prompts says whether
    a longer one is skipped and counted or refused. `model_dir`: the run's model directory,
    whose tokenizer counts (None for the tiny model)."""
    return make_task(cfg.task, prompt_limit(cfg, model_dir))
