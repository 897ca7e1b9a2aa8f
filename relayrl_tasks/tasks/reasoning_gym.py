"""Procedural problems from reasoning-gym (`task.source: reasoning_gym`), scored by the
generator's own verifier.

    task: {source: reasoning_gym, generator: basic_arithmetic, options: {min_terms: 2}}

Prompt id k is entry k mod size of the generator seeded by (task.seed, epoch), epoch = k //
size: the same id is always the same problem and every epoch draws new ones. The held-out
problems come from a generator seeded apart, and training skips any problem whose question
is held out. The `reasoning_gym` reward reads the model's <answer>...</answer> (the whole
completion when there is none) and asks the generator's scorer.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np

from relayrl.config import ConfigError
from relayrl.config.task import ReasoningGymTaskConfig
from relayrl.plugins.tasks.problem import BadRecord, Problem, build_prompt
from relayrl_tasks.tasks.dataset import PromptLimit

EVAL_STREAM = 2**62  # the held-out generator's epoch number: never a training epoch
MAX_REDRAWS = 1000


class ReasoningGymTask:
    """Procedurally generated problems and their verifiers from reasoning-gym."""
    def __init__(self, cfg: ReasoningGymTaskConfig, limit: PromptLimit | None = None):
        try:
            import reasoning_gym
            from reasoning_gym.factory import DATASETS
        except ImportError:
            raise ConfigError("task.source 'reasoning_gym' needs the reasoning-gym package: "
                             "pip install 'relayrl[gym]'") from None

        if cfg.generator not in DATASETS:
            raise ConfigError(f"task.generator: unknown reasoning-gym dataset "
                             f"{cfg.generator!r}; known: {sorted(DATASETS)}")
        self.cfg = cfg
        self.limit = limit
        self.reward_name = cfg.reward or "reasoning_gym"
        self._rg = reasoning_gym
        try:
            self._generator(0)
        except Exception as err:  # the generator's own checks of its options
            raise ConfigError(f"task.options: {cfg.generator} refused {cfg.options}: "
                             f"{type(err).__name__}: {err}") from None
        from reasoning_gym.utils import SYSTEM_PROMPTS

        # without a system prompt of the user's, the generators' own: answer in <answer> tags
        self.prompt = cfg.prompt if cfg.prompt.system else cfg.prompt.model_copy(
            update={"system": SYSTEM_PROMPTS["default"]})
        self.skipped = 0  # problems too long for the rollout
        eval_rows = self._generator(EVAL_STREAM, max(cfg.eval_size, 1))
        self._held_out = []
        for i in range(cfg.eval_size):
            try:
                self._held_out.append(self._problem(-1 - len(self._held_out), eval_rows[i]))
            except BadRecord:
                self.skipped += 1
        self._held_out_questions = frozenset(p.metadata["question"] for p in self._held_out)

    @lru_cache(maxsize=4)  # noqa: B019  (a task lives as long as its process)
    def _generator(self, epoch: int, size: int | None = None) -> Any:
        seed = int(np.random.default_rng([self.cfg.seed, epoch]).integers(2**31))
        return self._rg.create_dataset(self.cfg.generator, seed=seed,
                                       size=size or self.cfg.size, **self.cfg.options)

    def problem(self, prompt_id: int) -> Problem:
        """The problem of a prompt id: epoch and index into the generator's seeded dataset of
        `size` entries, redrawing past an entry whose prompt is too long."""
        if prompt_id < 0:
            raise ValueError(f"prompt_id must be >= 0, got {prompt_id}")
        epoch, index = divmod(prompt_id, self.cfg.size)
        rows = self._generator(epoch)
        for redraw in range(MAX_REDRAWS):  # the next entries of the epoch, then wrapping
            entry = rows[(index + redraw * 7919) % self.cfg.size]
            if entry["question"] in self._held_out_questions:
                continue
            try:
                return self._problem(prompt_id, entry)
            except BadRecord:
                self.skipped += 1
        raise ConfigError(f"task: {self.cfg.generator} keeps producing held-out or over-long "
                         "problems; lower task.eval_size or change task.options")

    def eval_problems(self) -> list[Problem]:
        """The held-out problems, drawn with a seed of their own."""
        return list(self._held_out)

    def _problem(self, prompt_id: int, entry: Mapping[str, Any]) -> Problem:
        text, messages = build_prompt(self.prompt, entry)
        if self.limit is not None and self.limit.count(text, messages) > self.limit.max_tokens:
            raise BadRecord(f"task: a {self.cfg.generator} prompt is longer than the "
                            f"{self.limit.max_tokens} tokens the rollout takes")
        return Problem(prompt_id, text, str(entry["answer"]), messages,
                       _plain({"question": entry["question"], "metadata": entry["metadata"]}))


def _plain(value: Any) -> Any:
    """JSON-like values (tuples become lists) as they would arrive over the wire."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
