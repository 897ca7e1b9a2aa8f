"""What an operator asked of the run (relayrl.contracts.control), as the trainer reads it.

Before every step the loop takes the live staleness bound and sampling temperature: loop
state, never written into the run's config. A watcher thread ends the loop gracefully once
the run is stopping and the trainer has finished every prompt the scheduler handed out (its
stop target): the loop then checkpoints and exits as it does at max_steps."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis as redis_lib

from relayrl.config import TrainerRun
from relayrl.contracts import control
from relayrl.contracts.keys import RunKeys

log = logging.getLogger(__name__)
WATCH_S = 0.5


class Operator:
    def __init__(self, r: redis_lib.Redis, keys: RunKeys, cfg: TrainerRun):
        self.r = r
        self.keys = keys
        self.cfg = cfg  # the configured values the live ones start from

    def settings(self, current: control.LiveSettings) -> control.LiveSettings:
        """The live settings for the next step; `current` while Redis is away."""
        try:
            return control.read_settings(self.r, self.keys, self.cfg.live)
        except redis_lib.RedisError as err:
            log.warning("live settings not read (%s); keeping the current ones", err)
            return current

    def graceful_stop_due(self, finished: int) -> bool:
        if control.read_run_state(self.r, self.keys) is not control.RunState.STOPPING:
            return False
        target = control.read_stop_target(self.r, self.keys)
        return target is not None and finished >= target

    def watch(self, stop: threading.Event, finished: Callable[[], int]) -> threading.Event:
        """An event set when `stop` is, or when a graceful stop is due; `finished()` counts
        the scheduler's prompts the trainer has finished."""
        halt = threading.Event()

        def run() -> None:
            while not halt.is_set():
                if stop.wait(WATCH_S):
                    halt.set()
                    return
                try:
                    due = self.graceful_stop_due(finished())
                except redis_lib.RedisError:
                    continue
                if due:
                    log.info("the run is stopping and every prompt handed out is finished")
                    halt.set()

        threading.Thread(target=run, name="operator", daemon=True).start()
        return halt

    def publish(self, record: dict) -> None:
        try:
            control.push_metrics(self.r, self.keys, record, control.RECENT_METRICS_KEPT)
        except redis_lib.RedisError as err:  # the API shows older figures meanwhile
            log.warning("recent metrics not stored: %s", err)
