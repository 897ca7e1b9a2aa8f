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

from relayrl.runtime.metrics import plot_rewards, plot_throughput

log = logging.getLogger(__name__)
DRAW_TIMEOUT_S = 120


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
