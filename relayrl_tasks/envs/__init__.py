"""The environments RelayRL ships (the calculator, verifiers and OpenEnv adapters), how a run
loads its environment (loading.py), the token bookkeeping between turns (turns.py) and the
rule that plays an episode (play.py), which the rollout worker and the evaluator share."""

from relayrl_tasks.envs.loading import BUILTIN, load_environment, make_environment
from relayrl_tasks.envs.turns import TurnGlue

__all__ = ["BUILTIN", "TurnGlue", "load_environment", "make_environment"]
