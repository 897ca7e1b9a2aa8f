"""The tasks RelayRL ships: the addition example, a dataset's records, reasoning-gym, a
verifiers environment's dataset; the factory of a task from its config (make_task), and of
the run's, its prompts measured by the run's tokenizer (make_run_task, load_run_task)."""

from relayrl_tasks.tasks.addition import AdditionTask
from relayrl_tasks.tasks.dataset import DatasetTask, PromptLimit
from relayrl_tasks.tasks.registry import check_reward, make_task, reward_spec
from relayrl_tasks.tasks.run_task import load_run_task, make_run_task

__all__ = ["AdditionTask", "DatasetTask", "PromptLimit", "check_reward", "load_run_task",
           "make_run_task", "make_task", "reward_spec"]
