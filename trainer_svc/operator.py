"""What an operator asked of the run (relayrl.contracts.control), as the trainer applies it.

Before every step the trainer takes the live staleness bound and sampling temperature. A
watcher thread ends the loop gracefully once the run is stopping and the trainer has finished
every prompt the scheduler handed out (its stop target): the loop then checkpoints and exits
as it does at max_steps."""

from __future__ import annotations

import logging
import threading

import redis as redis_lib

from relayrl.contracts import control

log = logging.getLogger(__name__)
WATCH_S = 0.5


class OperatorSignals:
    def __init__(self, trainer):
        self.t = trainer
        self.settings = control.configured_settings(trainer.cfg)
        self._warned_temperature = False

    def apply_settings(self) -> None:
        """Take the live settings for the next step (kept as they were if Redis is away)."""
        t = self.t
        try:
            settings = control.read_settings(t.r, t.keys, t.cfg)
        except redis_lib.RedisError as err:
            log.warning("live settings not read (%s); keeping the current ones", err)
            return
        if settings == self.settings:
            return
        t.tc.max_staleness = settings.max_staleness  # train_step reads the bound from here
        if t.learner.parallel.active:
            if settings.temperature != self.settings.temperature and not self._warned_temperature:
                log.warning("under torchrun the trainer keeps rescoring at temperature %s",
                            t.objective.temperature)
                self._warned_temperature = True
        else:  # the loss, the engine check and eval all rescore at the sampling temperature
            t.cfg.rollout.temperature = settings.temperature
            t.objective.temperature = settings.temperature
        log.info("live settings at step %d: %s", t.step, settings.model_dump())
        self.settings = settings

    def graceful_stop_due(self) -> bool:
        t = self.t
        if control.read_run_state(t.r, t.keys) is not control.RunState.STOPPING:
            return False
        target = control.read_stop_target(t.r, t.keys)
        return target is not None and t.totals["scheduler_prompts_finished"] >= target

    def watch(self, stop: threading.Event) -> threading.Event:
        """An event set when `stop` is, or when a graceful stop is due."""
        halt = threading.Event()

        def run() -> None:
            while not halt.is_set():
                if stop.wait(WATCH_S):
                    halt.set()
                    return
                try:
                    due = self.graceful_stop_due()
                except redis_lib.RedisError:
                    continue
                if due:
                    log.info("the run is stopping and every prompt handed out is finished")
                    halt.set()

        threading.Thread(target=run, name="operator", daemon=True).start()
        return halt

    def publish(self, record: dict) -> None:
        try:
            control.push_metrics(self.t.r, self.t.keys, record, control.RECENT_METRICS_KEPT)
        except redis_lib.RedisError as err:  # the API shows older figures meanwhile
            log.warning("recent metrics not stored: %s", err)
