"""What the run trains on: the addition example, a dataset's records, reasoning-gym."""

from relayrl.plugins.tasks.addition import AdditionTask
from relayrl.plugins.tasks.dataset import DatasetTask, PromptLimit
from relayrl.plugins.tasks.problem import Problem
from relayrl.plugins.tasks.registry import Task, check_reward, make_run_task, make_task, reward_spec

__all__ = ["AdditionTask", "DatasetTask", "Problem", "PromptLimit", "Task", "check_reward",
           "make_run_task", "make_task", "reward_spec"]
