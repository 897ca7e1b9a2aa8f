"""A seeded schedule of process faults for a live run: which process is killed (-9), and
when. The same seed, rounds and worker count always give the same schedule.

Each round kills every kind of process once, in a fixed order (KINDS); a fault is due a
random number of trainer steps after the previous one's due step (plus room for it to recover:
due_steps) and fires then, plus a random delay into that step, so kills land at varied points
of the loop (mid-generation, mid-batch, mid-save).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# The slowest to restart (a worker loads its engine) comes last: the run goes on without it,
# so the steps it takes to return are steps the next faults cannot use.
KINDS = ("relay", "buffer", "scheduler", "trainer", "redis", "rollout")


@dataclass(frozen=True)
class Fault:
    index: int
    kind: str
    target: str  # the launcher's name of the process: rollout-1, relay, ..., redis
    after_steps: int  # trainer steps after the previous fault recovered (or the run started)
    delay_s: float  # then this long before the kill

    @property
    def action(self) -> str:
        return "kill -9, restart"


def draw_schedule(seed: int, rounds: int, num_workers: int, kinds: tuple[str, ...] = KINDS,
                  max_after_steps: int = 3, max_delay_s: float = 1.0) -> list[Fault]:
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {list(KINDS)}")
    rng = random.Random(seed)
    faults = []
    for _ in range(rounds):
        for kind in kinds:
            target = f"rollout-{rng.randrange(num_workers)}" if kind == "rollout" else kind
            faults.append(Fault(len(faults), kind, target, rng.randint(1, max_after_steps),
                                round(rng.uniform(0.0, max_delay_s), 3)))
    return faults


# the run goes on while one of these is down (the other workers generate; the trainer keeps
# stepping and its publishes fail until the relay is back)
RUN_CONTINUES = ("rollout", "relay")


# steps a run may take between a fault's due step and its kill (its delay, the injector's
# poll, a burst of batches the buffer held while a service was down). The small test stack
# steps 15-17 times a second on an idle machine once a restart is over, so a delay near
# max_delay_s alone is up to 17 steps; 8 once left the last fault on the run's final step,
# where no later step could show it recovered.
LANDING_SLACK_STEPS = 24


def due_steps(schedule: list[Fault], steps_per_restart: int,
              slack: int = LANDING_SLACK_STEPS) -> list[int]:
    """The trainer step each fault of `schedule` is due at, counted from the run's start:
    its `after_steps` past the previous one's due step, plus one step showing the run
    recovered, `slack` steps for the previous kill landing late, and `steps_per_restart`
    where the run goes on while the previous process restarts. Due steps are absolute, so
    one fault landing late does not push every later one back."""
    due, step = [], 0
    for i, fault in enumerate(schedule):
        if i:
            prev = schedule[i - 1]
            step += 1 + slack + (steps_per_restart if prev.kind in RUN_CONTINUES else 0)
        step += fault.after_steps
        due.append(step)
    return due


def steps_needed(schedule: list[Fault], steps_per_restart: int,
                 slack: int = LANDING_SLACK_STEPS) -> int:
    """Trainer steps a run needs so that every fault of `schedule` fires before its end: the
    last one's due step, its landing slack, and a step or two showing the run recovered. (A
    killed trainer replays the steps since its checkpoint, which does not move the run's
    target.) The last fault's process may come back after the run's end: the run waits
    for it."""
    return due_steps(schedule, steps_per_restart, slack)[-1] + slack + 3
