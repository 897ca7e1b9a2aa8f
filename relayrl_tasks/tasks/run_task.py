"""The run's task: the task of its config, every prompt it reads measured by the tokenizer of
the run's model against the longest prompt the run's engine takes.

It reads a tokenizer's directory and builds no model: a pretrained model not yet converted is
converted by the `convert` its caller passes (relayrl_torch.models.pretrained_dir, model side).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from relayrl.config import ConfigError, HfModel, PretrainedModel, RunsTask, TinyModel
from relayrl.plugins.chat import encode_problem
from relayrl.plugins.tasks import Task
from relayrl_tasks.tasks.dataset import PromptLimit, PromptTokens
from relayrl_tasks.tasks.registry import make_task

ConvertModel = Callable[[PretrainedModel], Path]  # a pretrained model's converted directory


def prompt_limit(cfg: RunsTask, model_dir: Path | None) -> PromptLimit | None:
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


def prompt_counter(cfg: RunsTask, model_dir: Path | None) -> PromptTokens | None:
    """A prompt's length in tokens as the run's workers lay it out: the tokenizer in
    `model_dir` (the run's model directory), the chat template applied as a worker applies
    it. None for the tiny model."""
    if isinstance(cfg.model, TinyModel):
        return None
    assert model_dir is not None, "a model other than the tiny one has a directory"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return lambda text, messages: len(encode_problem(tokenizer, text, messages))


def make_run_task(cfg: RunsTask, model_dir: Path | None) -> Task:
    """The run's task, every prompt it reads measured once, chat template applied, against the
    longest prompt the configured engine takes (prompt_limit); task.long_prompts says whether
    a longer one is skipped and counted or refused. `model_dir`: the run's model directory,
    whose tokenizer counts (None for the tiny model)."""
    return make_task(cfg.task, prompt_limit(cfg, model_dir))


def tokenizer_dir(cfg: RunsTask, convert: ConvertModel) -> Path | None:
    """The directory whose tokenizer counts the run's prompts: the configured model's (a hub
    snapshot fetched first), a pretrained model's as `convert` gives it (converted first where
    it is not there yet); None for the tiny model."""
    m = cfg.model
    if isinstance(m, TinyModel):
        return None
    if isinstance(m, HfModel):
        return m.directory()
    return convert(m)


def load_run_task(cfg: RunsTask, convert: ConvertModel) -> Task:
    """The run's task, its prompts counted by the run's tokenizer (make_run_task, tokenizer_dir)."""
    return make_run_task(cfg, tokenizer_dir(cfg, convert))
