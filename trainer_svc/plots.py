"""The run's reward.png and throughput.png, drawn by a process of their own.

A draw reads the whole metrics file and renders two figures: about 0.35 s of CPU for a
1200-step run of the tiny example on this machine, which the training loop paid every
`plot_every` steps while it waited. Drawn on a thread of the trainer instead, it still cost
the loop as much: matplotlib holds the GIL while it renders, and the loop's Python waits for
it. So a thread only starts `python -m trainer_svc.plots METRICS RUN_DIR TITLE` and waits
for it. The loop just asks for a draw; a request made while one is being drawn is served
once that one ends (the newest rows are what a picture should show), and `close` draws the
last picture before the trainer reports its run finished. A draw that fails is logged and
the run goes on: a picture is never worth a step.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

from relayrl.metrics import plot_rewards, plot_throughput

log = logging.getLogger(__name__)
DRAW_TIMEOUT_S = 120


def draw(metrics_path: Path, run_dir: Path, title: str) -> None:
    plot_rewards(metrics_path, run_dir / "reward.png", title)
    plot_throughput(metrics_path, run_dir / "throughput.png", title)


class Plotter:
    def __init__(self, metrics_path: Path, run_dir: Path, title: str):
        self.args = (Path(metrics_path), Path(run_dir), title)
        self.draws = 0
        self.failures = 0
        self._due = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="plots", daemon=True)
        self._thread.start()

    def request(self) -> None:
        """Draw soon, off the caller's thread."""
        self._due.set()

    def close(self) -> None:
        """Wait for a draw in progress, then draw the final picture on this thread."""
        self._closing = True
        self._due.set()
        self._thread.join()
        self._draw()

    def _loop(self) -> None:
        while True:
            self._due.wait()
            if self._closing:
                return
            self._due.clear()
            self._draw()

    def _draw(self) -> None:
        metrics, run_dir, title = self.args
        try:
            done = subprocess.run([sys.executable, "-m", "trainer_svc.plots", str(metrics),
                                   str(run_dir), title], capture_output=True, text=True,
                                  timeout=DRAW_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as err:
            self.failures += 1
            log.warning("could not draw the run's plots (training goes on): %s", err)
            return
        if done.returncode:
            self.failures += 1
            last = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
            log.warning("could not draw the run's plots (training goes on): %s", last[0])
        else:
            self.draws += 1


if __name__ == "__main__":
    draw(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
