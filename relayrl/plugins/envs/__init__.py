"""Multi-turn environments: the protocol a user implements (relayrl.plugins.envs.protocol), the
token bookkeeping between turns (relayrl.plugins.envs.turns) and the built-in calculator."""

from relayrl.plugins.envs.protocol import (
    BUILTIN,
    Environment,
    Message,
    Step,
    as_step,
    load_environment,
    make_environment,
)
from relayrl.plugins.envs.turns import TurnGlue

__all__ = ["BUILTIN", "Environment", "Message", "Step", "TurnGlue", "as_step",
           "load_environment", "make_environment"]
