"""A task made of a dataset's records (`task.source: dataset`).

Every row is checked once, when the task is built: a row without a usable prompt or answer,
or whose prompt is longer than the rollout can take, is skipped, counted and logged with its
row number and field (or refused, `long_prompts: error`). Prompt id k is record
`order[epoch][k mod n]` of the n usable training rows, epoch = k // n, the order a permutation
seeded by (task.seed, epoch): the same id is always the same record, a restarted scheduler
hands out what the first one would have, and each epoch reshuffles. Held-out problems have
ids -1, -2, ...

    task = DatasetTask(cfg)                # relayrl.plugins.tasks.make_task does this from a config
    task.problem(0), task.eval_problems()
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from relayrl.config import ConfigError
from relayrl.config.task import DatasetTaskConfig
from relayrl.plugins.tasks.problem import (
    BadRecord,
    Problem,
    build_prompt,
    metadata_of,
    reference_of,
)
from relayrl_tasks.tasks.sources import format_of, open_rows
from relayrl_tasks.tasks.stream import StreamedRows

log = logging.getLogger(__name__)

PromptTokens = Callable[[str, tuple[Mapping[str, str], ...]], int]
"""(text, messages) -> the prompt's length in the model's tokens."""
MAX_LOGGED = 5


class PromptLimit:
    """The longest prompt the rollout can take, how to measure one, and where the limit comes
    from (for the reason a row is skipped)."""

    def __init__(self, count: PromptTokens, max_tokens: int,
                 source: str = "rollout.max_prompt_tokens, or the engine's window less "
                 "rollout.max_new_tokens"):
        self.count, self.max_tokens, self.source = count, max_tokens, source


class DatasetTask:
    """Problems from a dataset file or hub dataset, read with Hugging Face `datasets`."""
    def __init__(self, cfg: DatasetTaskConfig, limit: PromptLimit | None = None,
                 rows: Any = None, eval_rows: Any = None):
        """`rows`, `eval_rows`: records already read (a `datasets.Dataset` or a list of
        mappings), in place of `cfg.path` and its held-out split."""
        self.cfg = cfg
        self.reward_name = cfg.reward
        self.limit = limit
        self.skipped: Counter[str] = Counter()  # reason -> rows skipped, over both splits
        where = cfg.path or cfg.hub
        train = open_rows(cfg, cfg.path, cfg.split) if rows is None else rows
        if cfg.streaming:
            self._stream = StreamedRows(train, cfg, self._problem_or_none)
            self._train = None
            self._held_out = self._eval_streamed()
            return
        good = self._usable(train, f"{where} ({cfg.split})")
        self._rows = train
        self._held_out, self._train = self._split(good, eval_rows)
        if not len(self._train):
            raise ConfigError(f"task: no usable training rows in {where}; skipped: "
                             f"{dict(self.skipped)}")
        self._order: dict[int, np.ndarray] = {}

    # The training stream ---------------------------------------------------------------

    def problem(self, prompt_id: int) -> Problem:
        """The problem of a prompt id: epoch and index into the training split, shuffled per
        epoch by the seed, so the same id is the same record after any restart."""
        if prompt_id < 0:
            raise ValueError(f"prompt_id must be >= 0, got {prompt_id}")
        if self._train is None:
            return self._stream.problem(prompt_id)
        epoch, index = divmod(prompt_id, len(self._train))
        row = int(self._train[self._epoch_order(epoch)[index]])
        return self._problem(prompt_id, self._rows[row])

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if epoch not in self._order:
            self._order = {epoch: np.random.default_rng(
                [self.cfg.seed, 2, epoch]).permutation(len(self._train))}
        return self._order[epoch]

    def eval_problems(self) -> list[Problem]:
        """The held-out problems (from `task.eval_path` or `task.eval_split`, or rows held out
        of the training data), never handed out for training."""
        return list(self._held_out)

    # Building problems -----------------------------------------------------------------

    def _problem(self, prompt_id: int, record: Mapping[str, Any]) -> Problem:
        text, messages = build_prompt(self.cfg.prompt, record)
        return Problem(prompt_id, text, reference_of(record, self.cfg.answer_field),
                       messages, metadata_of(record))

    def _problem_or_none(self, prompt_id: int, record: Mapping[str, Any], where: str
                         ) -> Problem | None:
        """The record's problem; None (counted, the first few logged) for a bad one."""
        try:
            problem = self._problem(prompt_id, record)
        except BadRecord as err:
            return self._skip(str(err), where)
        if self.limit is not None:
            n = self.limit.count(problem.text, problem.messages)
            if n > self.limit.max_tokens:
                reason = (f"prompt of {n} tokens, over the {self.limit.max_tokens} the rollout "
                          f"takes ({self.limit.source})")
                if self.cfg.long_prompts == "error":
                    raise ConfigError(f"task: {where}: {reason}; task.long_prompts: skip "
                                     "trains without it")
                return self._skip("prompt too long", where, reason)
        return problem

    def _skip(self, reason: str, where: str, detail: str = "") -> None:
        self.skipped[reason] += 1
        if self.skipped[reason] <= MAX_LOGGED:
            log.warning("task: skipping %s: %s", where, detail or reason)
        return None

    def _usable(self, rows: Any, name: str) -> np.ndarray:
        good = [i for i, record in _numbered(rows, name)
                if self._problem_or_none(0, record, f"{name} row {i}") is not None]
        if self.skipped:
            log.warning("task: %s: %d of %d rows usable; skipped %s", name, len(good),
                        len(rows), dict(self.skipped))
        return np.asarray(good, dtype=np.int64)

    def _split(self, good: np.ndarray, rows: Any = None) -> tuple[list[Problem], np.ndarray]:
        """(held-out problems, the training rows' indices)."""
        cfg = self.cfg
        name = f"{cfg.eval_path or cfg.path or cfg.hub} ({cfg.eval_split or 'eval'})"
        if rows is None and (cfg.eval_path or cfg.eval_split):
            if cfg.eval_split and cfg.path and format_of(cfg) != "arrow":
                raise ConfigError(f"task.eval_split {cfg.eval_split!r}: {cfg.path} is a file "
                                 "with one split; hold out a file with task.eval_path")
            rows = open_rows(cfg, cfg.eval_path or cfg.path, cfg.eval_split or "train")
        if rows is not None:
            held = self._usable(rows, name)
            pick = np.random.default_rng([cfg.seed, 1]).permutation(len(held))[:cfg.eval_size]
            return self._eval_list(rows, held[np.sort(pick)]), good
        k = min(cfg.eval_size, round(cfg.eval_fraction * len(good)))
        order = np.random.default_rng([cfg.seed, 1]).permutation(len(good))
        return (self._eval_list(self._rows, good[np.sort(order[:k])]),
                np.sort(good[order[k:]]))

    def _eval_list(self, rows: Any, picked: Iterable[int]) -> list[Problem]:
        return [self._problem(-1 - i, rows[int(row)]) for i, row in enumerate(picked)]

    def _eval_streamed(self) -> list[Problem]:
        cfg = self.cfg
        if cfg.eval_fraction:
            raise ConfigError("task.eval_fraction needs a dataset read whole: with streaming, "
                             "hold out with eval_split or eval_path")
        if not (cfg.eval_path or cfg.eval_split) or not cfg.eval_size:
            return []
        rows = open_rows(cfg, cfg.eval_path or cfg.path, cfg.eval_split or "train")
        out: list[Problem] = []
        for i, record in enumerate(rows):
            problem = self._problem_or_none(-1 - len(out), record, f"eval row {i}")
            if problem is not None:
                out.append(problem)
            if len(out) == cfg.eval_size:
                break
        return out


def _numbered(rows: Any, name: str) -> Iterable[tuple[int, Mapping[str, Any]]]:
    total = len(rows)
    step = max(1, total // 10)
    for i, record in enumerate(rows):
        if i and i % step == 0 and total >= 100_000:
            log.info("task: checked %d of %d rows of %s", i, total, name)
        yield i, record
