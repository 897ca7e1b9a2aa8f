"""Synthetic tasks with verifiable answers."""

from relayrl.tasks.addition import AdditionTask, Problem
from relayrl.tasks.registry import make_task

__all__ = ["AdditionTask", "Problem", "make_task"]
