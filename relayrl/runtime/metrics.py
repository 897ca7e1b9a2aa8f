"""Run metrics: one JSON line per trainer step (optionally TensorBoard scalars and a Weights &
Biases run too), and reading them back. The trainer draws its plots from them
(trainer_svc/plots.py).

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
