"""What a task is: its problems (Problem) and the protocol every task follows (Task). The
tasks RelayRL ships (the addition example, datasets, reasoning-gym, verifiers) and the
factory that builds the run's are relayrl_tasks.tasks."""

from relayrl.plugins.tasks.problem import Problem, Task

__all__ = ["Problem", "Task"]
