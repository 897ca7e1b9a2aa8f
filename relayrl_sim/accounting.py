"""What a mode's run amounts to: its per-step records and the figures measured over them.

Every mode writes one `StepRecord` per trainer step. Rates are measured over a window that
leaves out the first `warmup` steps, while the asynchronous pipeline fills up.

Only what the trainer trains counts as throughput: a group the staleness rule drops
(relayrl.rules.staleness.is_stale, the live trainer's split_stale) is generated, decoded and then
thrown away, so its response tokens are reported as wasted, beside the tokens prefilled again
for a migrated sequence (its KV cache re-prefilled on the target, as vLLM's live repack does)
and those recomputed after a KV-cache preemption. An engine holds one version at a time;
with sim.tails `preempt` a worker reloads under its running sequences and prefills their
context again (counted as `swap`), so their later tokens carry a newer version than their
first. The rollout's restart rule never fires: a draining worker is behind the trainer's
floor, and a worker holding a sequence it would restart drains instead of reloading. (A
resumed sequence that falls below the floor later is dropped when its group reaches the
trainer, where a live worker would start its group over: its tokens count as dropped, not
restarted.)

Utilization is the fraction of the fleet's sequence slots that were decoding: sum over
decode steps of (step time * sequences in the batch), over workers * max_batch * wall time.
Staleness is the trainer's version minus a trained sample's oldest token version, as a
distribution over trained sequences and over their response tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class StepRecord:
    time: float  # when the step's effects are visible (weights out, for the barrier modes)
    samples: int = 0  # trained
    tokens: int = 0  # trained response tokens
    dropped_samples: int = 0  # generated, then dropped as stale
    dropped_tokens: int = 0  # their response tokens
    lags: tuple[tuple[int, int, int], ...] = ()  # (lag, trained samples, their tokens)
    train_s: float = 0.0
    # cumulative over the run from here on
    busy: float = 0.0  # sequence-seconds of decoding, whole fleet
    migrations: int = 0  # sequences migrated
    migration_s: float = 0.0  # their modelled cost: transfer, plus re-prefill on the target
    reprefill_tokens: int = 0  # context tokens prefilled again after a migration
    recompute_tokens: int = 0  # context tokens prefilled again after a KV preemption
    preemptions: int = 0
    swaps: int = 0  # reloads under running sequences (sim.tails preempt)
    swap_tokens: int = 0  # their context, prefilled again on the new weights


START = StepRecord(0.0)


def lag_counts(lags: Iterable[tuple[int, int, int]]) -> tuple[tuple[int, int, int], ...]:
    """(lag, samples, tokens) summed per lag, in order of lag."""
    samples: Counter[int] = Counter()
    tokens: Counter[int] = Counter()
    for lag, n, t in lags:
        samples[lag] += n
        tokens[lag] += t
    return tuple((lag, samples[lag], tokens[lag]) for lag in sorted(samples))


def group_lags(version: int, oldest: int, cuts: list[list[tuple[int, int]] | None],
               responses: list[int]) -> list[tuple[int, int, int]]:
    """(lag, samples, tokens) for a group the trainer at `version` keeps: each sample by its
    oldest token (`oldest`, its prompt's version), each token by the version it was decoded
    with. cuts[i]: sample i's [(version, tokens before it), ...] from its first on, when it
    was resumed on newer weights (sim.tails preempt); None when it never was."""
    if not any(cuts):
        return [(version - oldest, len(responses), sum(responses))]
    lags = [(version - oldest, len(responses), 0)]
    for sample, response in zip(cuts, responses, strict=True):
        sample = sample or [(oldest, 0)]
        ends = [start for _, start in sample[1:]] + [response]
        lags += [(version - v, 0, end - start) for (v, start), end in zip(sample, ends,
                                                                          strict=True)]
    return lags


def distribution(weights: dict[int, int]) -> dict[str, float]:
    """mean, p50, p99 and max of integer values weighted by their counts (lower quantiles:
    the smallest value with at least that share of the weight at or below it)."""
    total = sum(weights.values())
    if not total:
        return {"mean": 0.0, "p50": 0, "p99": 0, "max": 0}
    out: dict[str, float] = {"mean": round(sum(v * w for v, w in weights.items()) / total, 3)}
    for name, share in (("p50", 0.5), ("p99", 0.99)):
        seen = 0
        for value in sorted(weights):
            seen += weights[value]
            if seen >= share * total:
                out[name] = value
                break
    out["max"] = max(v for v, w in weights.items() if w)
    return out


@dataclass(frozen=True)
class ModeResult:
    mode: str
    workers: int
    trained_samples_per_s: float
    trained_tokens_per_s: float
    generated_samples_per_s: float  # trained or dropped
    dropped_share: float  # of the samples generated, dropped as stale
    wasted_tokens: dict[str, int]  # dropped (decoded); reprefill, recompute, swap (prefilled)
    wasted_share: float  # wasted tokens over trained response tokens plus wasted
    staleness_seq: dict[str, float]  # over trained sequences
    staleness_tok: dict[str, float]  # over their response tokens
    utilization: float
    migrations: int
    migration_s: float  # modelled seconds of migrating: transfers, plus re-prefills
    preemptions: int
    swaps: int  # reloads under running sequences
    trainer_idle: float
    sim_seconds: float  # simulated time of the measured window
    wall_seconds: float  # how long simulating it took

    @property
    def staleness_max(self) -> int:
        return int(self.staleness_seq["max"])

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(mode: str, workers: int, max_batch: int, warmup: int,
              records: list[StepRecord], wall_seconds: float) -> ModeResult:
    """Rates over records[warmup] .. records[-1]; records[0] is START."""
    first, last = records[warmup], records[-1]
    window = records[warmup + 1:]
    span = last.time - first.time
    samples = sum(r.samples for r in window)
    tokens = sum(r.tokens for r in window)
    dropped = sum(r.dropped_samples for r in window)
    wasted = {"dropped": sum(r.dropped_tokens for r in window),
              "reprefill": last.reprefill_tokens - first.reprefill_tokens,
              "recompute": last.recompute_tokens - first.recompute_tokens,
              "swap": last.swap_tokens - first.swap_tokens}
    seq: Counter[int] = Counter()
    tok: Counter[int] = Counter()
    for r in window:
        for lag, n, t in r.lags:
            seq[lag] += n
            tok[lag] += t
    return ModeResult(
        mode=mode, workers=workers,
        trained_samples_per_s=float(samples / span),
        trained_tokens_per_s=float(tokens / span),
        generated_samples_per_s=float((samples + dropped) / span),
        dropped_share=float(dropped / max(1, samples + dropped)),
        wasted_tokens=wasted,
        wasted_share=float(sum(wasted.values()) / max(1, tokens + sum(wasted.values()))),
        staleness_seq=distribution(seq), staleness_tok=distribution(tok),
        utilization=float((last.busy - first.busy) / (workers * max_batch * span)),
        migrations=last.migrations - first.migrations,
        migration_s=float(last.migration_s - first.migration_s),
        preemptions=last.preemptions - first.preemptions,
        swaps=last.swaps - first.swaps,
        trainer_idle=float(1.0 - sum(r.train_s for r in window) / span),
        sim_seconds=float(span), wall_seconds=wall_seconds)
