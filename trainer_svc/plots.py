"""The run's reward.png and throughput.png, drawn by a process of their own.

A draw reads the whole metrics file and renders two figures: about 0.35 s of CPU for a
1200-step run of the tiny example on this machine, which the training loop paid every
`plot_every` steps while it waited. Drawn on a thread of the trainer instead, it still cost
the loop as much: matplotlib holds the GIL while it renders, and the loop's Python waits for
it. So each draw is `python -m trainer_svc.plots METRICS RUN_DIR TITLE`, started and left to
run; a request while one is still drawing is skipped (the next one draws newer rows), and
`close` draws the last picture before the trainer reports its run finished. A draw that
fails is logged (its traceback goes to the trainer's log) and the run goes on: a picture is
never worth a step.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from relayrl.runtime.metrics import StepRecord, read_records

log = logging.getLogger(__name__)
DRAW_TIMEOUT_S = 120


def rolling_mean(values: list[float], window: int) -> list[float]:
    """Mean of each value and the window - 1 before it."""
    out = []
    for i in range(len(values)):
        recent = values[max(0, i - window + 1):i + 1]
        out.append(sum(recent) / len(recent))
    return out


def set_keys(rows: list[StepRecord]) -> list[str]:
    """The eval/<set>/pass@1 keys of `rows`, in the order the sets first appear."""
    seen: dict[str, None] = {}
    for r in rows:
        for key in r.extra:
            if key.startswith("eval/") and key.endswith("/pass@1") and key.count("/") == 2:
                seen[key] = None
    return list(seen)


def plot_rewards(metrics_path: str | Path, out_png: str | Path, title: str = "") -> None:
    """Training reward per step and held-out accuracy at each eval (the first set's sampled
    and greedy, every other set's pass@1), against steps."""
    from matplotlib.figure import Figure

    rows = read_records(metrics_path)
    train = [r for r in rows if r.figures.reward_mean is not None]
    evals = [r for r in rows + read_records(Path(metrics_path).with_name("eval.jsonl"))
             if r.figures.accuracy_sampled is not None]
    evals.sort(key=lambda r: r.step)
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    if train:
        steps = [r.step for r in train]
        rewards = [r.figures.reward_mean for r in train]
        ax.plot(steps, rewards, alpha=0.25, color="tab:blue")
        window = max(1, len(rewards) // 40)
        ax.plot(steps, rolling_mean(rewards, window), color="tab:blue",
                label=f"train reward ({window}-step mean)")
    if evals:
        for name, label, color in (
            ("accuracy_sampled", "held-out accuracy, sampled", "tab:orange"),
            ("accuracy_greedy", "held-out accuracy, greedy", "tab:green"),
        ):
            points = [(r.step, getattr(r.figures, name)) for r in evals]
            points = [(step, v) for step, v in points if v is not None]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=color,
                    label=label)
        for key in set_keys(evals)[1:]:  # the other eval sets: their pass@1
            ax.plot([r.step for r in evals if key in r.extra],
                    [r.extra[key] for r in evals if key in r.extra],
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

    rows = [r for r in read_records(metrics_path) if r.figures.samples_per_s is not None]
    panels = (
        ("samples / s", (("samples_per_s", "samples trained", "tab:blue"),)),
        ("tokens / s", (("tokens_per_s", "response tokens trained", "tab:purple"),
                        ("generated_tokens_per_s", "tokens generated", "tab:green"))),
        ("policy-version lag", (("lag_mean", "batch mean", "tab:orange"),
                                ("lag_max", "batch max", "tab:red"))),
    )
    window = max(1, len(rows) // 40)
    fig = Figure(figsize=(7, 7))
    axes = fig.subplots(len(panels), 1, sharex=True)
    for ax, (ylabel, series) in zip(axes, panels, strict=True):
        for key, label, color in series:
            points = [(r.step, getattr(r.figures, key)) for r in rows]
            steps = [step for step, v in points if v is not None]
            values = [v for _, v in points if v is not None]
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


def draw(metrics_path: Path, run_dir: Path, title: str) -> None:
    plot_rewards(metrics_path, run_dir / "reward.png", title)
    plot_throughput(metrics_path, run_dir / "throughput.png", title)


class Plotter:
    def __init__(self, metrics_path: Path, run_dir: Path, title: str):
        self.cmd = [sys.executable, "-m", "trainer_svc.plots", str(metrics_path), str(run_dir),
                    title]
        self.draws = 0
        self.failures = 0
        self._proc: subprocess.Popen | None = None

    def request(self) -> None:
        """Start a draw, unless one is still running."""
        if self._proc is not None:
            if self._proc.poll() is None:
                return
            self._reap()
        try:
            self._proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL)
        except OSError as err:
            self._failed(err)

    def close(self) -> None:
        """Wait for a draw in progress, then draw the final picture and wait for it."""
        self._wait()
        self.request()
        self._wait()

    def _wait(self) -> None:
        if self._proc is None:
            return
        try:
            self._proc.wait(timeout=DRAW_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reap()

    def _reap(self) -> None:
        code, self._proc = self._proc.returncode, None
        if code:
            self._failed(f"exit code {code}")
        else:
            self.draws += 1

    def _failed(self, why) -> None:
        self.failures += 1
        log.warning("could not draw the run's plots (training goes on): %s", why)


if __name__ == "__main__":
    draw(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
