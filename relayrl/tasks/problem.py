"""relayrl.tasks.problem, an older path of relayrl.plugins.tasks.problem
(relayrl.plugins.moved)."""

import relayrl.plugins.tasks.problem as _new
from relayrl.plugins.moved import alias

__getattr__, __all__ = alias(__name__, _new)
