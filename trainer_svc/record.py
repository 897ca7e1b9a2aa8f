"""A step's record, built once from what the step did.

The loop (trainer_svc.loop) hands each step's `StepResult` here, with its evaluation if one
ran, and writes the `StepRecord` that comes back to metrics.jsonl, /metrics and the control
API: nothing else writes a step's figures. Beside the builder are the figures it computes
from the step's samples (what went wrong in them, by kind; how many episodes and turns they
held is counted from their masks by relayrl_tasks.episodes.sequence, beside the mask's
writer) and the throughput over the last 30 s.

A sample whose reward raised or was refused, or whose environment failed, is scored 0 and
carries the error as text (`Sample.reward_error`). The text's form names its kind: an
environment's `environment: <Class>.<method>: <kind>: <detail>` (relayrl_tasks.episodes.play),
else one of the reward's (relayrl_tasks.rewards.scoring). Each step counts them per kind
into metrics.jsonl (`errors/reward_error_kinds/<kind>`, `errors/env_error_kinds/<kind>`) and
logs one example of each kind, so a run that fails in two ways says so twice, not once.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from relayrl.contracts.control import LiveSettings
from relayrl.contracts.keys import is_external
from relayrl.contracts.messages import Batch, Group, Sample
from relayrl.runtime.metrics import StepFigures, StepRecord
from relayrl_tasks.episodes.play import error_kind as environment_error_kind
from relayrl_tasks.episodes.sequence import episode_counts
from relayrl_tasks.rewards.scoring import reward_error_kind
from trainer_svc.batching import TrainBatch, lag_histogram, token_lag_histogram
from trainer_svc.objective import UpdateResult
from trainer_svc.parity import logprob_gaps, replayed_share

log = logging.getLogger(__name__)


@dataclass
class Rates:
    """Samples and tokens per second over the last 30 s (`Throughput`)."""

    samples_per_s: float
    tokens_per_s: float
    generated_tokens_per_s: float


@dataclass
class StepResult:
    """What one step did: the batch it read, how it split it, the update (if any) and what
    it published. `version` is the weights the step updated; a step taken publishes
    version + 1, a skipped one (its loss or gradient norm not finite) publishes nothing."""

    version: int
    batch: Batch
    settings: LiveSettings  # the operator's live settings the step ran with
    stale: list[Group]
    uniform: list[Group]  # left out because their rewards all agree (dapo)
    kept: list[Group]  # trained on
    agreeing: int  # of the groups within the bound, those whose rewards all agree
    episodes: bool  # the samples are environment episodes
    taken: bool = True
    update: UpdateResult | None = None  # None: nothing was kept, the weights stand
    tb: TrainBatch | None = None
    rescored: object = None  # the engine check's re-scored tokens (trainer_svc.parity)
    publish_times: tuple[float, float, float] | None = None  # the previous version's
    publish_counts: dict[str, int] = field(default_factory=dict)
    set_aside: dict[str, int] = field(default_factory=dict)  # the books' totals after it
    step_s: float | None = None
    elapsed_s: float | None = None
    samples_trained: int = 0  # the run's total so far
    rates: Rates | None = None
    evaluated: Evaluation | None = None  # of the new version

    def trained(self) -> tuple[int, int]:
        """(samples, response tokens) the step trained on."""
        if self.tb is None or self.update is None:
            return 0, 0
        return self.tb.rewards.numel(), int(self.tb.response_lengths.sum())


@dataclass
class Evaluation:
    """The eval sets' figures for one version (relayrl_torch.evaluation.evaluate_sets)."""

    figures: dict[str, float]
    seconds: float


def step_record(r: StepResult) -> StepRecord:
    """The record of a step, with its evaluation if it ran one."""
    stale_samples = [s for g in r.stale for s in g.samples]
    figures = StepFigures(
        groups_dropped_stale=len(r.stale), samples_dropped_stale=len(stale_samples),
        groups_filtered_uniform=len(r.uniform),
        samples_filtered_uniform=sum(len(g.samples) for g in r.uniform),
        # TRL's frac_reward_zero_std: groups that teach nothing (all right or all wrong),
        # before any filter
        groups_uniform_frac=r.agreeing / max(len(r.kept) + len(r.uniform), 1),
        # decoded, then thrown away: bench/longtail.py counts it as waste
        tokens_dropped_stale=sum(len(s.response_tokens) for s in stale_samples),
        external_groups=sum(is_external(g.prompt_id) for g in r.batch.groups))
    bound = r.settings.max_staleness
    within = [*r.kept, *r.uniform]
    record = StepRecord(r.version + 1, figures, {
        **lag_histogram(r.batch, r.version, bound),
        **token_lag_histogram(within, r.version, bound)})
    if not r.taken:  # no new version: the record is of the step not taken
        record.step = r.version
        record.figures.step_skipped = 1
        record.extra.update(r.set_aside)
        return record
    if r.update is not None:
        record = record.updated(_trained(r))
    f = record.figures
    f.publish_stall_s, f.publish_copy_s, f.publish_send_s = r.publish_times or (None,) * 3
    f.step_s, f.elapsed_s = r.step_s, r.elapsed_s
    f.run_samples_per_s = r.samples_trained / max(r.elapsed_s or 0.0, 1e-9)
    if f.step_s:
        f.trainer_tokens_per_s = (f.tokens or 0) / f.step_s
    if r.rates is not None:
        f.samples_per_s = r.rates.samples_per_s
        f.tokens_per_s = r.rates.tokens_per_s
        f.generated_tokens_per_s = r.rates.generated_tokens_per_s
    f.max_staleness, f.temperature = r.settings.max_staleness, r.settings.temperature
    record.extra.update({**r.publish_counts, **r.set_aside})
    if r.evaluated is not None:
        record = record.updated(eval_record(record.step, r.evaluated))
    return record


def _trained(r: StepResult) -> StepRecord:
    """The update's figures: the loss's statistics, and what the trained samples held."""
    tb, update = r.tb, r.update
    assert tb is not None and update is not None
    losses = StepRecord.from_json({f"train/{k}": v for k, v in update.stats.items()})
    samples = [s for g in r.kept for s in g.samples]
    errors = count_errors(samples, r.version + 1)
    episodes = episode_counts(samples) if r.episodes else None
    figures = StepFigures(
        reward_mean=tb.rewards.mean().item(), reward_std=tb.rewards.std().item(),
        samples=tb.rewards.numel(), groups=len(r.kept),
        tokens=int(tb.response_lengths.sum()),
        response_len_mean=tb.response_lengths.float().mean().item(),
        lag_mean=tb.lags.float().mean().item(), lag_max=int(tb.lags.max()),
        reward_errors=errors.total, reward_error_kinds=errors.reward,
        env_error_kinds=errors.environment,
        episodes=episodes[0] if episodes else None,
        turns=episodes[1] if episodes else None,
        routes_replayed_frac=replayed_share(tb),
        **logprob_gaps(update.old_logprobs, tb.behaviour_logprobs, tb.response_mask,
                       tb.token_versions, r.version, r.rescored))
    return losses.updated(StepRecord(r.version + 1, figures))


def eval_record(step: int, evaluated: Evaluation) -> StepRecord:
    """An evaluation's figures as the record of version `step`."""
    record = StepRecord.from_json({"step": step, **evaluated.figures})
    record.figures.eval_s = evaluated.seconds
    return record


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


class Throughput:
    """Samples and tokens trained per second over about the last 30 s: the figures of the
    steps that ended in the window, over the time since the step before them ended (the
    loop's start for the first), so a window of one long step still has a rate.
    `generated()` reads the tokens the workers generated so far."""

    WINDOW_S = 30.0

    def __init__(self, generated: Callable[[], int]) -> None:
        self.generated = generated
        # (end time, samples, tokens trained, tokens generated so far) of recent steps
        self.marks = [(time.monotonic(), 0, 0, generated())]

    def rates(self, samples: int, tokens: int) -> Rates:
        """The rates with a step of `samples` and `tokens` that has just ended."""
        now = time.monotonic()
        self.marks.append((now, samples, tokens, self.generated()))
        while len(self.marks) > 2 and now - self.marks[1][0] >= self.WINDOW_S:
            self.marks.pop(0)  # the window starts where its oldest step began
        start, counted = self.marks[0], self.marks[1:]
        span = max(now - start[0], 1e-6)
        return Rates(sum(m[1] for m in counted) / span, sum(m[2] for m in counted) / span,
                     max(counted[-1][3] - start[3], 0) / span)
