"""relayrl.envs.protocol, an older path of relayrl.plugins.envs.protocol
(relayrl.plugins.moved)."""

import relayrl.plugins.envs.protocol as _new
from relayrl.plugins.moved import alias

__getattr__, __all__ = alias(__name__, _new, {
    **dict.fromkeys(("BUILTIN", "import_user_module", "load_environment", "make_environment"),
                    "relayrl_tasks.envs.loading"),
    "ConfigError": "relayrl.config"})
