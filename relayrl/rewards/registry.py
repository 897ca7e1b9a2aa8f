"""relayrl.rewards.registry, an older path of relayrl.plugins.rewards.registry
(relayrl.plugins.moved)."""

import relayrl.plugins.rewards.registry as _new
from relayrl.plugins.moved import alias

__getattr__, __all__ = alias(__name__, _new)
