"""What went wrong in a step's samples, by kind, and how many episodes and turns it held.

A sample whose reward raised or was refused, or whose environment failed, is scored 0 and
carries the error as text (`Sample.reward_error`). The text's form names its kind: an
environment's `environment: <Class>.<method>: <kind>: <detail>` (relayrl_tasks.envs.play),
else one of the reward's (relayrl_tasks.rewards.scoring). Each step counts them per kind
into metrics.jsonl (`errors/reward_error_kinds/<kind>`, `errors/env_error_kinds/<kind>`) and
logs one example of each kind, so a run that fails in two ways says so twice, not once.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from relayrl.contracts.messages import Sample
from relayrl_tasks.envs.play import error_kind as environment_error_kind
from relayrl_tasks.rewards.scoring import reward_error_kind

log = logging.getLogger(__name__)


@dataclass
class ErrorCounts:
    total: int
    reward: dict[str, int] | None  # None when there was none
    environment: dict[str, int] | None


def count_errors(samples: Sequence[Sample], step: int) -> ErrorCounts:
    """The samples' errors per kind; one example of each kind logged."""
    reward: Counter[str] = Counter()
    environment: Counter[str] = Counter()
    examples: dict[tuple[str, str], str] = {}
    for s in samples:
        if not s.reward_error:
            continue
        kind = environment_error_kind(s.reward_error)
        source = "environment" if kind else "reward"
        kind = kind or reward_error_kind(s.reward_error)
        (environment if source == "environment" else reward)[kind] += 1
        examples.setdefault((source, kind), s.reward_error)
    for (source, kind), example in examples.items():
        count = (environment if source == "environment" else reward)[kind]
        # scored 0: a broken reward would otherwise look like a hard task
        log.warning("step %d: %d samples scored 0 for a %s error of kind %s, e.g. %s",
                    step, count, source, kind, example)
    return ErrorCounts(sum(reward.values()) + sum(environment.values()),
                       dict(reward) or None, dict(environment) or None)


def episode_counts(samples: Sequence[Sample]) -> tuple[int, int]:
    """(episodes, model turns): each sample of an environment run is one episode, and each
    run of the policy's tokens in its response one turn."""
    turns = 0
    for s in samples:
        mask = s.policy_token_mask
        if mask.size:  # a turn starts wherever a policy token follows a non-policy one
            turns += int(mask[0]) + int(np.count_nonzero(mask[1:] & ~mask[:-1]))
    return len(samples), turns
