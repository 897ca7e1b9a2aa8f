"""relayrl.tasks, an older path of relayrl.plugins.tasks (relayrl.plugins.moved)."""

import relayrl.plugins.tasks as _new
from relayrl.plugins.moved import alias

__getattr__, __all__ = alias(__name__, _new, dict.fromkeys(
    ("AdditionTask", "DatasetTask", "PromptLimit", "check_reward", "make_run_task",
     "make_task", "reward_spec"), "relayrl_tasks.tasks"))
