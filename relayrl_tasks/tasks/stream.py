"""A streamed dataset's prompts by id (`task.streaming: true`).

The rows are read in order, epoch after epoch, each epoch reshuffled through a buffer seeded
by (task.seed, epoch) (`IterableDataset.shuffle`); prompt id k is the k-th usable record of
that sequence, so it is the same record in every process and after any restart. Ids are
handed out nearly in order: the reader keeps the last WINDOW problems for re-issued leases
and starts the stream over for an id older than that (a restarted scheduler's first leases).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from relayrl.config import ConfigError
from relayrl.config.task import DatasetTaskConfig
from relayrl.plugins.tasks.problem import Problem

WINDOW = 65_536
MakeProblem = Callable[[int, Mapping[str, Any], str], Problem | None]


class StreamedRows:
    """A hub dataset read as a stream, for datasets too large to download whole."""
    def __init__(self, rows: Any, cfg: DatasetTaskConfig, make: MakeProblem):
        self.rows, self.cfg, self.make = rows, cfg, make
        self.recent: OrderedDict[int, Problem] = OrderedDict()
        self._restart()

    def problem(self, prompt_id: int) -> Problem:
        """The problem of a prompt id, read forward from the stream (restarting it for an id
        already passed and no longer remembered)."""
        if prompt_id in self.recent:
            return self.recent[prompt_id]
        if prompt_id < self.next_id:
            self._restart()
        while self.next_id <= prompt_id:
            self._read_one()
        return self.recent[prompt_id]

    def _restart(self) -> None:
        self.next_id = 0
        self.epoch = 0
        self.made_this_epoch = 0
        self._records = self._epoch_records()

    def _epoch_records(self) -> Iterator[tuple[int, Mapping[str, Any]]]:
        shuffled = self.rows.shuffle(seed=(self.cfg.seed + self.epoch) % 2**32,
                                     buffer_size=self.cfg.shuffle_buffer)
        return enumerate(shuffled)

    def _read_one(self) -> None:
        """Read records until one makes a problem: it gets the next id."""
        while True:
            try:
                row, record = next(self._records)
            except StopIteration:
                if not self.made_this_epoch:
                    raise ConfigError(f"task: {self.cfg.path or self.cfg.hub} holds no usable "
                                     "row") from None
                self.epoch += 1
                self.made_this_epoch = 0
                self._records = self._epoch_records()
                continue
            problem = self.make(self.next_id, record, f"epoch {self.epoch} row {row}")
            if problem is not None:
                break
        self.made_this_epoch += 1
        self.recent[self.next_id] = problem
        self.next_id += 1
        while len(self.recent) > WINDOW:
            self.recent.popitem(last=False)
