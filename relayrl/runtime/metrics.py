"""Run metrics: one JSON line per trainer step (optionally TensorBoard scalars and a Weights &
Biases run too), and the reward and throughput plots drawn from them.

Each file has one writer: the trainer writes metrics.jsonl; with eval.mode separate the
evaluator process writes its eval records to eval.jsonl beside it (same record shape, `step`
is the evaluated version), and the reward plot reads both. Appending lines from two
processes to one file could interleave partial lines; two files cannot.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relayrl.config import ConfigError

if TYPE_CHECKING:
    from relayrl.config import RunConfig


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

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, sort_keys=True) + "\n")
        numbers = {k: v for k, v in record.items()
                   if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)}
        step = record.get("step", 0)
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


def open_run_metrics(cfg: RunConfig, name: str = "metrics.jsonl",
                     job_type: str = "train") -> MetricsWriter:
    """A run's metrics file with the TensorBoard and W&B output its config asks for."""
    from relayrl.runtime.wandb_sink import open_wandb

    return open_metrics(cfg.run_dir, cfg.trainer.tensorboard, open_wandb(cfg, job_type), name)


def open_tensorboard(log_dir: str | Path):
    """A torch SummaryWriter on log_dir; ValueError when the tensorboard package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise ConfigError(f"TensorBoard output needs the tensorboard package (pip install "
                         f"tensorboard, or the relayrl[tensorboard] extra): {err}") from None
    return SummaryWriter(log_dir=str(log_dir), flush_secs=10)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line of a metrics file; a last line still being written (no newline
    yet: its writer is appending while this reads) is left out."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text().split("\n")[:-1]  # after the last newline: empty, or torn
    return [json.loads(line) for line in lines if line.strip()]


def rolling_mean(values: list[float], window: int) -> list[float]:
    """Mean of each value and the window - 1 before it."""
    out = []
    for i in range(len(values)):
        recent = values[max(0, i - window + 1):i + 1]
        out.append(sum(recent) / len(recent))
    return out


def set_keys(rows: list[dict]) -> list[str]:
    """The eval/<set>/pass@1 keys of `rows`, in the order the sets first appear."""
    seen: dict[str, None] = {}
    for r in rows:
        for key in r:
            if key.startswith("eval/") and key.endswith("/pass@1") and key.count("/") == 2:
                seen[key] = None
    return list(seen)


def plot_rewards(metrics_path: str | Path, out_png: str | Path, title: str = "") -> None:
    """Training reward per step and held-out accuracy at each eval (the first set's sampled
    and greedy, every other set's pass@1), against steps."""
    from matplotlib.figure import Figure

    rows = read_metrics(metrics_path)
    train = [r for r in rows if "train/reward_mean" in r]
    evals = [r for r in rows + read_metrics(Path(metrics_path).with_name("eval.jsonl"))
             if "eval/accuracy_sampled" in r]
    evals.sort(key=lambda r: r["step"])
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    if train:
        steps = [r["step"] for r in train]
        rewards = [r["train/reward_mean"] for r in train]
        ax.plot(steps, rewards, alpha=0.25, color="tab:blue")
        window = max(1, len(rewards) // 40)
        ax.plot(steps, rolling_mean(rewards, window), color="tab:blue",
                label=f"train reward ({window}-step mean)")
    if evals:
        for key, label, color in (
            ("eval/accuracy_sampled", "held-out accuracy, sampled", "tab:orange"),
            ("eval/accuracy_greedy", "held-out accuracy, greedy", "tab:green"),
        ):
            ax.plot([r["step"] for r in evals if key in r], [r[key] for r in evals if key in r],
                    marker="o", color=color, label=label)
        for key in set_keys(evals)[1:]:  # the other eval sets: their pass@1
            ax.plot([r["step"] for r in evals if key in r], [r[key] for r in evals if key in r],
                    marker=".", linestyle="--", label=f"{key.split('/')[1]} pass@1")
    ax.set_xlabel("trainer step")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title or "RelayRL reward")
    fig.tight_layout()
    tmp = Path(out_png).with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    tmp.replace(out_png)


def plot_throughput(metrics_path: str | Path, out_png: str | Path, title: str = "") -> None:
    """Samples/s, tokens/s and policy-version lag against trainer steps, one panel each;
    per-step values faint, their rolling mean solid."""
    from matplotlib.figure import Figure

    rows = [r for r in read_metrics(metrics_path) if "throughput/samples_per_s" in r]
    panels = (
        ("samples / s", (("throughput/samples_per_s", "samples trained", "tab:blue"),)),
        ("tokens / s", (("throughput/tokens_per_s", "response tokens trained", "tab:purple"),
                        ("throughput/generated_tokens_per_s", "tokens generated", "tab:green"))),
        ("policy-version lag", (("staleness/lag_mean", "batch mean", "tab:orange"),
                                ("staleness/lag_max", "batch max", "tab:red"))),
    )
    window = max(1, len(rows) // 40)
    fig = Figure(figsize=(7, 7))
    axes = fig.subplots(len(panels), 1, sharex=True)
    for ax, (ylabel, series) in zip(axes, panels, strict=True):
        for key, label, color in series:
            steps = [r["step"] for r in rows if key in r]
            values = [r[key] for r in rows if key in r]
            if values:
                ax.plot(steps, values, color=color, alpha=0.25)
                ax.plot(steps, rolling_mean(values, window), color=color,
                        label=f"{label} ({window}-step mean)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="upper left")
        else:  # a run from before the figure was recorded
            ax.text(0.5, 0.5, "not recorded", transform=ax.transAxes, ha="center",
                    color="gray")
    axes[0].set_title(title or "RelayRL throughput and staleness")
    axes[-1].set_xlabel("trainer step")
    fig.tight_layout()
    tmp = Path(out_png).with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    tmp.replace(out_png)
