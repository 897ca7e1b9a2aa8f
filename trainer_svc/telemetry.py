"""What the trainer exports on /metrics: its totals, the publisher's counters, and the newest
value of each per-step figure it also writes to metrics.jsonl (StepFigures and the classes
read back from the newest records; None, so not exported, until a step records them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, make_dataclass
from typing import TYPE_CHECKING

import redis

from relayrl.runtime.exporter import ServiceMetrics
from relayrl.runtime.metrics import StepFigures, StepRecord
from relayrl.runtime.stats import Stats, counter, gauge
from trainer_svc.batching import LAG_BUCKETS, lag_bucket_names
from trainer_svc.books import Books, RedisLink

if TYPE_CHECKING:
    from trainer_svc.publisher import AsyncPublisher


@dataclass
class TrainerStats(Stats, section="train"):
    step: int = gauge("Optimizer steps taken.")
    finished: float = gauge("1 once trainer.max_steps is reached.")
    published_version: int = gauge("Newest version the relay accepted.", section="weights")


@dataclass
class TrainTotals(Stats, section="train"):
    """Running totals: the fields are keys of Trainer.totals."""

    samples_trained: int = counter("Samples trained on.")
    samples_dropped_stale: int = counter("Samples dropped by the staleness bound.")
    groups_dropped_stale: int = counter("Groups dropped by the staleness bound.")
    groups_filtered_uniform: int = counter(
        "Groups left out because their rewards all agree (dapo).")
    external_groups: int = counter("Groups submitted by external producers.")
    nonfinite_steps: int = counter(
        "Steps skipped because their loss or gradient norm was not finite.")
    batches_quarantined: int = counter(
        "Batch entries with groups the model cannot train on, set aside.")
    groups_quarantined: int = counter("Groups set aside: undecodable, or not fitting the model.")


@dataclass
class PublishCounts(Stats, section="weights"):
    """The publisher's totals, in every step's record and on /metrics."""

    versions_published: int = counter("Versions published.")
    bytes_published: int = counter("Bytes of weights published.")
    publish_failures: int = counter("Publishes that failed.")


@dataclass
class EvalSetStats(Stats, section="eval_set"):
    """Each eval set's figures at the last eval, labelled by the set's name (its
    eval/<set>/... keys in metrics.jsonl)."""

    pass_at_1: dict[str, float] | None = gauge("Pass@1 of each eval set.", label="set")
    pass_at_k: dict[str, float] | None = gauge(
        "Pass@k of each eval set with k = its samples > 1.", label="set")
    accuracy_greedy: dict[str, float] | None = gauge(
        "Mean reward of each eval set's greedy answers.", label="set")
    reward_mean: dict[str, float] | None = gauge(
        "Mean reward of each eval set's sampled answers.", label="set")
    response_len_mean: dict[str, float] | None = gauge(
        "Mean tokens of each eval set's sampled answers (over all turns).", label="set")

    @classmethod
    def from_record(cls, record: dict) -> EvalSetStats:
        """From a record's eval/<set>/<figure> keys (pass@<k> for k > 1 is pass_at_k)."""
        by: dict[str, dict[str, float]] = {f.name: {} for f in fields(cls)}
        for key, value in record.items():
            section, _, rest = key.partition("/")
            name, _, figure = rest.partition("/")
            if section != "eval" or not figure or "/" in figure:
                continue
            if figure.startswith("pass@"):
                figure = "pass_at_1" if figure == "pass@1" else "pass_at_k"
            if figure in by:
                by[figure][name] = value
        return cls(**{figure: sets or None for figure, sets in by.items()})


# staleness/samples_lag_<bucket>, every bucket any max_staleness can give
LagStats = make_dataclass("LagStats", [
    (name.split("/")[1], "float | None",
     gauge(f"Samples of the last batch with lag {name.rsplit('_', 1)[1]}."))
    for name in lag_bucket_names(LAG_BUCKETS + 1)], bases=(Stats,),
    namespace={"section": "staleness"})

STEP_KINDS: tuple[type[Stats], ...] = (StepFigures, LagStats)
TRAINER_KINDS = (TrainerStats, TrainTotals, PublishCounts, *STEP_KINDS, EvalSetStats)


def publish_counts(pub: AsyncPublisher) -> PublishCounts:
    return PublishCounts(versions_published=pub.versions_published,
                         bytes_published=pub.bytes_published, publish_failures=pub.failures)


def trainer_metrics(books: Books, pub: AsyncPublisher,
                    latest: Callable[[], StepRecord],
                    finished: Callable[[], bool]) -> ServiceMetrics:
    """/metrics of the trainer: its books and publisher, and `latest()`, the newest value of
    each figure of metrics.jsonl (replaced whole by the loop, never changed in place)."""
    def read() -> list[Stats]:
        newest = latest()
        last = newest.to_json()
        return [TrainerStats(step=books.step, finished=float(finished()),
                             published_version=pub.published_version),
                TrainTotals(**{f.name: books.totals[f.name] for f in fields(TrainTotals)}),
                publish_counts(pub),
                newest.figures, LagStats.from_figures(last),
                EvalSetStats.from_record(last)]

    return ServiceMetrics(TRAINER_KINDS, read)


def tokens_generated(link: RedisLink) -> int:
    """Tokens the rollout workers' training loops have generated so far (their own counts in
    Redis; 0 if Redis does not answer: it is only a throughput figure)."""
    try:
        counts = link.r.hvals(link.keys.tokens_generated)
    except redis.RedisError:
        return 0
    return sum(int(c) for c in counts)
