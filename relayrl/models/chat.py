"""relayrl.models.chat, an older path of relayrl.plugins.chat (relayrl.plugins.moved)."""

import relayrl.plugins.chat as _new
from relayrl.plugins.moved import alias

__getattr__, __all__ = alias(__name__, _new)
