"""Multi-turn environments: the protocol a user implements (relayrl.plugins.envs.protocol), the
token bookkeeping between turns (relayrl.plugins.envs.turns), environments whose model calls
functions (relayrl.plugins.envs.tools) and the built-in calculator."""

from relayrl.plugins.envs.protocol import (
    BUILTIN,
    Environment,
    Message,
    Step,
    as_step,
    load_environment,
    make_environment,
)
from relayrl.plugins.envs.tools import Tool, ToolEnvironment
from relayrl.plugins.envs.turns import TurnGlue

__all__ = ["BUILTIN", "Environment", "Message", "Step", "Tool", "ToolEnvironment", "TurnGlue",
           "as_step",
           "load_environment", "make_environment"]
