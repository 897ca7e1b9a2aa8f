"""relayrl.envs, an older path of relayrl.plugins.envs (relayrl.plugins.moved)."""

import relayrl.plugins.envs as _new
from relayrl.plugins.moved import alias

__getattr__, __all__ = alias(__name__, _new, {
    **dict.fromkeys(("BUILTIN", "load_environment", "make_environment"), "relayrl_tasks.envs"),
    "TurnGlue": "relayrl_tasks.episodes.turns"})
