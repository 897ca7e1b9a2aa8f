"""Multi-turn environments: the protocol a user implements (relayrl.plugins.envs.protocol),
environments whose model calls functions (relayrl.plugins.envs.tools) and the deadlines their
calls run under (relayrl.plugins.envs.calls). The environments RelayRL ships are
relayrl_tasks.envs, and the rules that play and score an episode relayrl_tasks.episodes."""

from relayrl.plugins.envs.protocol import Environment, Message, Step, as_step
from relayrl.plugins.envs.tools import Tool, ToolEnvironment

__all__ = ["Environment", "Message", "Step", "Tool", "ToolEnvironment", "as_step"]
