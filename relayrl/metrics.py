"""Run metrics: one JSON line per trainer step, and the reward curve drawn from them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsWriter:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, sort_keys=True) + "\n")

    def close(self) -> None:
        self._f.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_rewards(metrics_path: str | Path, out_png: str | Path, title: str = "") -> None:
    """Training reward per step and held-out accuracy at each eval, against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    train = [r for r in rows if "train/reward_mean" in r]
    evals = [r for r in rows if "eval/accuracy_sampled" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        steps = [r["step"] for r in train]
        rewards = [r["train/reward_mean"] for r in train]
        ax.plot(steps, rewards, alpha=0.25, color="tab:blue")
        window = max(1, len(rewards) // 40)
        smooth = []
        for i in range(len(rewards)):
            recent = rewards[max(0, i - window + 1):i + 1]
            smooth.append(sum(recent) / len(recent))
        ax.plot(steps, smooth, color="tab:blue", label=f"train reward ({window}-step mean)")
    if evals:
        for key, label, color in (
            ("eval/accuracy_sampled", "held-out accuracy, sampled", "tab:orange"),
            ("eval/accuracy_greedy", "held-out accuracy, greedy", "tab:green"),
        ):
            ax.plot([r["step"] for r in evals], [r[key] for r in evals], marker="o",
                    color=color, label=label)
    ax.set_xlabel("trainer step")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title or "RelayRL reward")
    fig.tight_layout()
    tmp = Path(out_png).with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(out_png)
