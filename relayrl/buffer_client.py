"""relayrl.buffer_client, an older path of relayrl.plugins.buffer_client
(relayrl.plugins.moved)."""

import relayrl.plugins.buffer_client as _new
from relayrl.plugins.moved import alias

__getattr__, __all__ = alias(__name__, _new)
