"""The trainer's books, one object that the trainer owns and hands to what keeps them: the
step reached, the last checkpoint's step, what the steps since it consumed or dropped (the
ledger a checkpoint acknowledges), and the running totals that metrics.jsonl, /metrics and
the checkpoint carry. Beside it, the trainer's link to Redis: the client, the run's keys,
and how a write waits out an outage until the service stops.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from relayrl.contracts.keys import RunKeys, is_external
from relayrl.contracts.messages import Group
from relayrl.runtime.backpressure import PressureCounters
from relayrl.runtime.outage import redis_write
from trainer_svc.checkpoint import Ledger

# Totals of batches set aside (trainer_svc.setaside), as metrics.jsonl names them `train/<k>`.
SET_ASIDE_TOTALS = ("batches_quarantined", "groups_quarantined", "nonfinite_steps")
TOTALS = ("samples_trained", "samples_dropped_stale", "groups_dropped_stale",
          "samples_filtered_uniform", "groups_filtered_uniform", "scheduler_prompts_finished",
          "external_groups", *SET_ASIDE_TOTALS)


@dataclass
class Books:
    step: int = 0
    saved_step: int = -1  # the step of the last checkpoint written (or resumed from)
    ledger: Ledger = field(default_factory=Ledger)
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOTALS, 0))

    def finish(self, prompt_ids: list[int]) -> None:
        """Count prompts finished: the scheduler's and external producers' apart."""
        external = sum(is_external(p) for p in prompt_ids)
        self.totals["external_groups"] += external
        self.totals["scheduler_prompts_finished"] += len(prompt_ids) - external

    def finish_untrained(self, prompt_ids: list[int]) -> None:
        """Finish prompts without training them: dropped in the ledger, counted finished."""
        self.ledger.dropped.extend(prompt_ids)
        self.finish(prompt_ids)

    def left_out(self, stale: list[Group], uniform: list[Group]) -> None:
        """Count the groups a step did not train on: past the staleness bound, or filtered
        because their rewards all agree."""
        self.totals["samples_dropped_stale"] += sum(len(g.samples) for g in stale)
        self.totals["groups_dropped_stale"] += len(stale)
        self.totals["samples_filtered_uniform"] += sum(len(g.samples) for g in uniform)
        self.totals["groups_filtered_uniform"] += len(uniform)

    def trained(self, samples: int) -> None:
        self.totals["samples_trained"] += samples

    def quarantined(self, prompt_ids: list[int]) -> None:
        """A batch entry's groups set aside before a step: finished untrained."""
        self.finish_untrained(prompt_ids)
        self.totals["groups_quarantined"] += len(prompt_ids)
        self.totals["batches_quarantined"] += 1

    def skipped(self, prompt_ids: list[int]) -> None:
        """A step not taken, its loss or gradient norm not finite: its groups, already
        counted finished, are dropped."""
        self.ledger.dropped.extend(prompt_ids)
        self.totals["nonfinite_steps"] += 1

    def restore(self, step: int, totals: dict[str, int]) -> None:
        """The books of a checkpoint resumed from; its ledger is acknowledged already."""
        self.step = self.saved_step = step
        self.totals.update(totals)

    def set_aside_counters(self) -> dict[str, int]:
        return {f"train/{k}": self.totals[k] for k in SET_ASIDE_TOTALS}


@dataclass
class RedisLink:
    r: redis.Redis
    keys: RunKeys
    pressure: PressureCounters = field(default_factory=PressureCounters)
    # the service's stop (SIGTERM): once set, a write gives up at its first failure rather
    # than wait out an outage nobody will end (the launcher and Redis may be gone)
    stop: threading.Event = field(default_factory=threading.Event)

    def write(self, fn: Callable[[], object], what: str) -> None:
        redis_write(fn, self.pressure, what, self.stop)
