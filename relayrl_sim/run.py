"""`simulate`: one mode on N simulated workers, from configuration to its ModeResult.

The modes' loops (relayrl_sim.barrier, relayrl_sim.streaming) use the records and config of
relayrl_sim.engine and relayrl_sim.accounting; this module sits above them all.
"""

from __future__ import annotations

import gc
import time

from relayrl_sim.accounting import ModeResult, summarize
from relayrl_sim.barrier import run_one_step_off, run_sync
from relayrl_sim.engine import MODES, SimConfig
from relayrl_sim.streaming import Streaming


def simulate(cfg: SimConfig, workers: int, mode: str) -> ModeResult:
    """Run one mode on `workers` workers for cfg.steps trainer steps."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    start = time.perf_counter()
    gc.disable()  # millions of live tuples make collections slow, and the runs make no cycles
    try:
        if mode == "sync":
            records = run_sync(cfg, workers)
        elif mode == "one_step_off":
            records = run_one_step_off(cfg, workers)
        else:
            records = Streaming(cfg, workers, repack=mode == "async_repack").run()
    finally:
        gc.enable()
    return summarize(mode, workers, cfg.costs.max_batch, cfg.warmup, records,
                     time.perf_counter() - start)
