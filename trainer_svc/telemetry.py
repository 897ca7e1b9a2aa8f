"""What the trainer exports on /metrics: its totals, the publisher's counters, and the newest
value of each per-step figure it also writes to metrics.jsonl."""

from __future__ import annotations

from typing import TYPE_CHECKING

import redis

from relayrl.exporter import MetricSpec, ServiceMetrics
from trainer_svc.batching import LAG_BUCKETS, lag_bucket_names
from trainer_svc.setaside import TOTALS as SET_ASIDE_TOTALS

if TYPE_CHECKING:
    from trainer_svc.trainer import Trainer

# per-step figures of metrics.jsonl, exported as gauges under the same names
STEP_METRICS = (
    MetricSpec("train/reward_mean", "gauge", "Mean reward of the last step's samples."),
    MetricSpec("train/reward_std", "gauge", "Reward std of the last step's samples."),
    MetricSpec("train/loss", "gauge", "Loss of the last step."),
    MetricSpec("train/grad_norm", "gauge", "Gradient norm of the last step, before clipping."),
    MetricSpec("train/entropy", "gauge", "Mean token entropy of the last step."),
    MetricSpec("train/clip_frac", "gauge", "Share of tokens whose ratio was clipped."),
    MetricSpec("train/is_weight_mean", "gauge", "Mean off-policy importance weight."),
    MetricSpec("train/response_len_mean", "gauge", "Mean response length, tokens."),
    MetricSpec("throughput/samples_per_s", "gauge", "Samples trained per second (30 s window)."),
    MetricSpec("throughput/tokens_per_s", "gauge",
               "Response tokens trained per second (30 s window)."),
    MetricSpec("throughput/generated_tokens_per_s", "gauge",
               "Tokens the rollout workers generated per second (30 s window), kept or not."),
    MetricSpec("throughput/trainer_tokens_per_s", "gauge",
               "Response tokens per second of the trainer's own step time."),
    MetricSpec("staleness/lag_mean", "gauge",
               "Mean versions between a sample's oldest token and the trainer."),
    MetricSpec("staleness/lag_max", "gauge", "Largest such lag in the last step."),
    *(MetricSpec(name, "gauge", f"Samples of the last batch with lag {name.rsplit('_', 1)[1]}.")
      for name in lag_bucket_names(LAG_BUCKETS + 1)),
    MetricSpec("weights/publish_stall_s", "gauge", "Seconds the last publish held training."),
    MetricSpec("weights/publish_copy_s", "gauge", "Seconds the last snapshot copy took."),
    MetricSpec("weights/publish_send_s", "gauge", "Seconds the last send to the relay took."),
    MetricSpec("time/step_s", "gauge", "Seconds the last step took."),
    MetricSpec("eval/accuracy_sampled", "gauge", "Held-out accuracy at the last eval, sampled."),
    MetricSpec("eval/accuracy_greedy", "gauge", "Held-out accuracy at the last eval, greedy."),
    MetricSpec("rollout/engine_logp_absdiff", "gauge",
               "Mean |engine - trainer| log-probability on same-version tokens."),
    MetricSpec("rollout/engine_kl", "gauge", "KL (k3) of engine to trainer, same version."),
)

TRAINER_METRICS = (
    MetricSpec("train/step", "gauge", "Optimizer steps taken."),
    MetricSpec("train/finished", "gauge", "1 once trainer.max_steps is reached."),
    MetricSpec("train/samples_trained", "counter", "Samples trained on."),
    MetricSpec("train/samples_dropped_stale", "counter",
               "Samples dropped by the staleness bound."),
    MetricSpec("train/groups_dropped_stale", "counter", "Groups dropped by the staleness bound."),
    MetricSpec("train/groups_filtered_uniform", "counter",
               "Groups left out because their rewards all agree (dapo)."),
    MetricSpec("train/external_groups", "counter", "Groups submitted by external producers."),
    MetricSpec("train/nonfinite_steps", "counter",
               "Steps skipped because their loss or gradient norm was not finite."),
    MetricSpec("train/batches_quarantined", "counter",
               "Batch entries with groups the model cannot train on, set aside."),
    MetricSpec("train/groups_quarantined", "counter",
               "Groups set aside: undecodable, or not fitting the model."),
    MetricSpec("weights/published_version", "gauge", "Newest version the relay accepted."),
    MetricSpec("weights/versions_published", "counter", "Versions published."),
    MetricSpec("weights/bytes_published", "counter", "Bytes of weights published."),
    MetricSpec("weights/publish_failures", "counter", "Publishes that failed."),
    *STEP_METRICS,
)


def trainer_metrics(trainer: Trainer) -> ServiceMetrics:
    def snapshot() -> dict[str, float]:
        t, totals, pub = trainer, trainer.totals, trainer.publisher
        latest = t.latest  # replaced whole by the loop, never changed in place
        return {
            **{s.name: latest[s.name] for s in STEP_METRICS if s.name in latest},
            "train/step": t.step,
            "train/finished": float(t.finished),
            "train/samples_trained": totals["samples_trained"],
            "train/samples_dropped_stale": totals["samples_dropped_stale"],
            "train/groups_dropped_stale": totals["groups_dropped_stale"],
            "train/groups_filtered_uniform": totals["groups_filtered_uniform"],
            "train/external_groups": totals["external_groups"],
            **{f"train/{k}": totals[k] for k in SET_ASIDE_TOTALS},
            "weights/published_version": pub.published_version,
            "weights/versions_published": pub.versions_published,
            "weights/bytes_published": pub.bytes_published,
            "weights/publish_failures": pub.failures,
        }

    return ServiceMetrics(TRAINER_METRICS, snapshot)


def tokens_generated(trainer: Trainer) -> int:
    """Tokens the rollout workers' training loops have generated so far (their own counts in
    Redis; 0 if Redis does not answer: it is only a throughput figure)."""
    try:
        counts = trainer.r.hvals(trainer.keys.tokens_generated)
    except redis.RedisError:
        return 0
    return sum(int(c) for c in counts)
