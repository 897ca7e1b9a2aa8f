"""A discrete-event simulator of an RL post-training cluster: N generation workers and one
trainer, in four modes (sync, one_step_off, async, async_repack) on the same seeded
workload. `relayrl simulate` sweeps fleet sizes; `simulate()` runs one mode."""

from relayrl_sim.accounting import ModeResult
from relayrl_sim.costs import CostParams, fit_decode_cost, load_costs
from relayrl_sim.engine import MODES, SimConfig, config_from_mapping
from relayrl_sim.run import simulate
from relayrl_sim.workload import RESPONSE_DISTS, LengthDist, Workload, heavy_tail

__all__ = ["MODES", "RESPONSE_DISTS", "CostParams", "LengthDist", "ModeResult", "SimConfig",
           "Workload", "config_from_mapping", "fit_decode_cost", "heavy_tail", "load_costs",
           "simulate"]
