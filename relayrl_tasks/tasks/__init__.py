"""The tasks RelayRL ships: the addition example, a dataset's records, reasoning-gym, a
verifiers environment's dataset; and the factory that builds the run's (make_run_task)."""

from relayrl_tasks.tasks.addition import AdditionTask
from relayrl_tasks.tasks.dataset import DatasetTask, PromptLimit
from relayrl_tasks.tasks.registry import check_reward, make_run_task, make_task, reward_spec

__all__ = ["AdditionTask", "DatasetTask", "PromptLimit", "check_reward", "make_run_task",
           "make_task", "reward_spec"]
