"""Run metrics: one `StepRecord` per trainer step, written as a JSON line (optionally as
TensorBoard scalars and to a Weights & Biases run too), and read back as records. The trainer
draws its plots from them (trainer_svc/plots.py); the control API serves the latest.

A record's named figures are the fields of `StepFigures`, each declared once with its
hierarchical name (`time/elapsed_s`) and help text; the /metrics exporter exports the same
fields. Figures whose names are only known at run time (each eval set's, each lag bucket's,
every loss statistic an objective reports) ride along in `extra`.

Each file has one writer: the trainer writes metrics.jsonl; with eval.mode separate the
evaluator process writes its eval records to eval.jsonl beside it (same record shape, `step`
is the evaluated version), and the reward plot reads both. Appending lines from two
processes to one file could interleave partial lines; two files cannot.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relayrl.config import ConfigError
from relayrl.runtime.stats import Stats, gauge

if TYPE_CHECKING:
    from relayrl.config import WritesMetrics


def _figure(help: str, section: str | None = None, label: str | None = None,
            exported: bool = True) -> Any:
    return gauge(help, section=section, label=label, optional=True, exported=exported)


@dataclass
class StepFigures(Stats, section="train"):
    """The named figures of a metrics record; None where a record does not measure one (an
    eval record has no loss, a skipped step no reward)."""

    # what the step trained on
    samples: int | None = _figure("Samples trained on in the step.")
    groups: int | None = _figure("Groups trained on in the step.")
    tokens: int | None = _figure("Response tokens trained on in the step.")
    reward_mean: float | None = _figure("Mean reward of the last step's samples.")
    reward_std: float | None = _figure("Reward std of the last step's samples.")
    response_len_mean: float | None = _figure("Mean response length, tokens.")
    episodes: int | None = _figure("Environment episodes trained on in the step.")
    turns: int | None = _figure("Model turns of those episodes.")
    # what the loss reports (the objective's other statistics go to `extra`)
    loss: float | None = _figure("Loss of the last step.")
    grad_norm: float | None = _figure("Gradient norm of the last step, before clipping.")
    entropy: float | None = _figure("Mean token entropy of the last step.")
    clip_frac: float | None = _figure("Share of tokens whose ratio was clipped.")
    is_weight_mean: float | None = _figure("Mean off-policy importance weight.")
    # what the step left out
    groups_dropped_stale: int | None = _figure(
        "Groups of the batch past the staleness bound.", exported=False)
    samples_dropped_stale: int | None = _figure("Their samples.", exported=False)
    tokens_dropped_stale: int | None = _figure("Their response tokens: decoded, then dropped.")
    groups_filtered_uniform: int | None = _figure(
        "Groups left out because their rewards all agree (dapo).", exported=False)
    samples_filtered_uniform: int | None = _figure("Their samples.")
    groups_uniform_frac: float | None = _figure(
        "Share of the kept groups whose rewards all agree, before any filter.")
    external_groups: int | None = _figure("Groups of the batch from external producers.",
                                          exported=False)
    step_skipped: int | None = _figure("1 for a step whose loss was not finite.")
    # what went wrong, per kind (one example of each is logged per step)
    reward_errors: int | None = _figure(
        "Samples of the last step whose reward raised or was refused (scored 0).")
    reward_error_kinds: dict[str, int] | None = _figure(
        "Of them, per kind of reward error.", section="errors", label="kind")
    env_error_kinds: dict[str, int] | None = _figure(
        "Of them, per kind of environment error.", section="errors", label="kind")
    # how fast
    samples_per_s: float | None = _figure(
        "Samples trained per second over the last 30 s.", section="throughput")
    tokens_per_s: float | None = _figure(
        "Response tokens trained per second over the last 30 s.", section="throughput")
    generated_tokens_per_s: float | None = _figure(
        "Tokens the rollout workers generated per second over the last 30 s, kept or not.",
        section="throughput")
    trainer_tokens_per_s: float | None = _figure(
        "Response tokens per second of the trainer's own step time.", section="throughput")
    run_samples_per_s: float | None = _figure(
        "Samples trained so far over the run's wall time so far.", section="throughput")
    lag_mean: float | None = _figure(
        "Mean versions between a sample's oldest token and the trainer.", section="staleness")
    lag_max: float | None = _figure("Largest such lag in the last step.", section="staleness")
    step_s: float | None = _figure("Seconds the last step took.", section="time")
    elapsed_s: float | None = _figure("Seconds since the trainer started.", section="time")
    eval_s: float | None = _figure("Seconds the last evaluation took.", section="time")
    # held-out evaluation (each set's own figures go to `extra`)
    accuracy_sampled: float | None = _figure("Held-out accuracy at the last eval, sampled.",
                                             section="eval")
    accuracy_greedy: float | None = _figure("Held-out accuracy at the last eval, greedy.",
                                            section="eval")
    # the engine against the trainer on the step's tokens
    engine_logp_absdiff: float | None = _figure(
        "Mean |engine - trainer| log-probability on same-version tokens.", section="rollout")
    engine_kl: float | None = _figure("KL (k3) of engine to trainer, same version.",
                                      section="rollout")
    engine_tokens_frac: float | None = _figure(
        "Share of the step's tokens rescored at their own version.", section="rollout")
    routes_replayed_frac: float | None = _figure(
        "Share of the step's policy tokens whose predicting position replayed the engine's "
        "experts (trainer.routing_replay; a mixture of experts only).", section="rollout")
    offpolicy_logp_absdiff: float | None = _figure(
        "Mean |behaviour - trainer| log-probability on all tokens.", section="rollout")
    offpolicy_kl: float | None = _figure("KL (k3) of behaviour to trainer, all tokens.",
                                         section="rollout")
    # the previous version's publish: how long it held training, copied, and sent
    publish_stall_s: float | None = _figure("Seconds the last publish held training.",
                                            section="weights")
    publish_copy_s: float | None = _figure("Seconds the last snapshot copy took.",
                                           section="weights")
    publish_send_s: float | None = _figure("Seconds the last send to the relay took.",
                                           section="weights")
    # the operator's live settings the step ran with
    max_staleness: int | None = _figure("Live staleness bound of the step.", section="control")
    temperature: float | None = _figure("Live sampling temperature of the step.",
                                        section="control")


_DECLARED = StepFigures.declared()


@dataclass
class StepRecord:
    """One line of metrics.jsonl: the trainer's step (or the evaluated version, in an eval
    record), its named figures, and the figures named at run time."""

    step: int
    figures: StepFigures = field(default_factory=StepFigures)
    extra: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The flat record metrics.jsonl holds: `{"step": 3, "train/loss": 0.1, ...}`; a
        labelled figure is one key per label, `errors/reward/<kind>`."""
        out: dict[str, Any] = {"step": self.step}
        for name, value in self.figures.figures().items():
            if isinstance(value, Mapping):
                out.update({f"{name}/{label}": v for label, v in value.items()})
            else:
                out[name] = value
        clash = out.keys() & self.extra.keys()
        assert not clash, f"extra figures {sorted(clash)} shadow named ones"
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> StepRecord:
        """The record a metrics.jsonl line holds (the inverse of to_json)."""
        rest = dict(row)
        step = int(rest.pop("step", 0))
        values: dict[str, Any] = {}
        for name, spec in _DECLARED:
            if spec.label is None:
                if spec.name in rest:
                    values[name] = rest.pop(spec.name)
                continue
            prefix = spec.name + "/"
            labelled = {k[len(prefix):]: rest.pop(k) for k in list(rest) if k.startswith(prefix)}
            if labelled:
                values[name] = labelled
        return cls(step, StepFigures(**values), rest)

    def updated(self, newer: StepRecord) -> StepRecord:
        """This record with every figure `newer` holds replaced by its value there: the newest
        value of each figure, as /metrics exports them."""
        named = {f.name: getattr(newer.figures, f.name) for f in fields(StepFigures)}
        figures = replace(self.figures, **{k: v for k, v in named.items() if v is not None})
        return StepRecord(newer.step, figures, {**self.extra, **newer.extra})

    def numbers(self) -> dict[str, float]:
        """Every number of the record but its step, by hierarchical name: what TensorBoard
        and W&B are given."""
        return {k: v for k, v in self.to_json().items()
                if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)}


class MetricsWriter:
    """metrics.jsonl, and with `tensorboard_dir` every number of a record as a TensorBoard
    scalar at the record's step (the hierarchical names become TensorBoard's groups), and
    with `wandb_run` (relayrl.runtime.wandb_sink) every number logged to Weights & Biases."""

    def __init__(self, path: str | Path, tensorboard_dir: str | Path | None = None,
                 wandb_run: Any = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.board = open_tensorboard(tensorboard_dir) if tensorboard_dir else None
        self.wandb = wandb_run
        self._f = open(self.path, "a", buffering=1)

    def write(self, record: StepRecord) -> None:
        self._f.write(json.dumps(record.to_json(), sort_keys=True) + "\n")
        numbers, step = record.numbers(), record.step
        if self.board is not None:
            for key, value in numbers.items():
                self.board.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log({"trainer/step": step, **numbers})

    def close(self) -> None:
        self._f.close()
        if self.board is not None:
            self.board.close()
        if self.wandb is not None:
            self.wandb.finish()


def open_metrics(run_dir: str | Path, tensorboard: bool, wandb_run: Any = None,
                 name: str = "metrics.jsonl") -> MetricsWriter:
    """run_dir/name, and TensorBoard scalars under run_dir/tensorboard if asked."""
    run_dir = Path(run_dir)
    try:
        return MetricsWriter(run_dir / name, run_dir / "tensorboard" if tensorboard else None,
                             wandb_run)
    except ValueError as err:
        raise ConfigError(f"trainer.tensorboard is true, but {err}") from None


def open_run_metrics(cfg: WritesMetrics, name: str = "metrics.jsonl",
                     job_type: str = "train") -> MetricsWriter:
    """A run's metrics file with the TensorBoard and W&B output its config asks for
    (cfg.metric_sinks(): a RunConfig's, or the evaluator's EvalRun's)."""
    from relayrl.runtime.wandb_sink import open_wandb

    return open_metrics(cfg.run_dir, cfg.metric_sinks().tensorboard, open_wandb(cfg, job_type),
                        name)


def open_tensorboard(log_dir: str | Path):
    """A torch SummaryWriter on log_dir; ValueError when the tensorboard package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise ConfigError(f"TensorBoard output needs the tensorboard package (pip install "
                         f"tensorboard, or the relayrl[tensorboard] extra): {err}") from None
    return SummaryWriter(log_dir=str(log_dir), flush_secs=10)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line of a metrics file, as the flat dict it holds; a last line still
    being written (no newline yet: its writer is appending while this reads) is left out."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text().split("\n")[:-1]  # after the last newline: empty, or torn
    return [json.loads(line) for line in lines if line.strip()]


def read_records(path: str | Path) -> list[StepRecord]:
    """Every complete record of a metrics file (read_metrics, typed)."""
    return [StepRecord.from_json(row) for row in read_metrics(path)]
