"""Arithmetic with a function-calling calculator whose latency has a heavy tail: the tool
workload of examples/smollm2_tools.yaml and bench/tool_workload.py.

The model may call `calculate(expression)` any number of times (up to the environment's
max_turns) before it answers; the answer is scored by the task's reward. Each call sleeps
a log-normal time (median MEDIAN_S, a few calls ten times longer), as a tool behind a
network does, so episodes finish at very different times: what asynchronous training
overlaps and synchronous training waits for. The options `median_s` and `max_s` set the
latency (a web search or a sandboxed test run takes seconds, not tenths).

    rollout:
      environment: {cls: examples.tools.calc_tools:CalcTools, max_turns: 4,
                    options: {median_s: 0.3, max_s: 5.0}}
"""

from __future__ import annotations

import math
import random
import time

from relayrl.config import ConfigError
from relayrl.plugins.envs import ToolEnvironment
from relayrl.plugins.tasks.problem import Problem
from relayrl_tasks.envs.calculator import evaluate, show

MEDIAN_S = 0.3  # of one call's latency
SIGMA = 1.2  # of its logarithm: one call in ten takes over 4.7x the median
MAX_S = 5.0  # no call sleeps longer (below the tool's deadline)
# this process's latency: the tool is a plain function, CalcTools' options set it
LATENCY = {"median_s": MEDIAN_S, "max_s": MAX_S}


def latency() -> float:
    """Seconds one call takes."""
    return min(LATENCY["max_s"], LATENCY["median_s"] * math.exp(random.gauss(0.0, SIGMA)))


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, e.g. "17 * 3 - 5".
    """
    time.sleep(latency())
    return show(evaluate(expression))  # a bad expression raises: the model is told why


# Worked calls opened before the question: the model sees calls, their tool turns and the
# answers laid out as its own episodes will be (a 135M model seldom calls a tool from the
# declaration alone).
EXAMPLE = [
    {"role": "user", "content": "Calculate 17 * 3 - 5."},
    {"role": "assistant", "content": '<tool_call>\n{"name": "calculate", "arguments": '
                                     '{"expression": "17 * 3 - 5"}}\n</tool_call>'},
    {"role": "tool", "content": "46"},
    {"role": "assistant", "content": "46"},
    {"role": "user", "content": "Calculate -( 8 + -3 ) * 6."},
    {"role": "assistant", "content": '<tool_call>\n{"name": "calculate", "arguments": '
                                     '{"expression": "-( 8 + -3 ) * 6"}}\n</tool_call>'},
    {"role": "tool", "content": "-30"},
    {"role": "assistant", "content": "-30"},
    {"role": "user", "content": "Calculate 91 - 12 * 4."},
    {"role": "assistant", "content": '<tool_call>\n{"name": "calculate", "arguments": '
                                     '{"expression": "91 - 12 * 4"}}\n</tool_call>'},
    {"role": "tool", "content": "43"},
    {"role": "assistant", "content": "43"},
]


class CalcTools(ToolEnvironment):
    """Options: `median_s` and `max_s` of a call's latency (max_s below tool_timeout_s),
    besides ToolEnvironment's."""

    tools = [calculate]

    def __init__(self, median_s: float = MEDIAN_S, max_s: float = MAX_S, **options):
        super().__init__(**options)
        for name, value in (("median_s", median_s), ("max_s", max_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"rollout.environment.options.{name}: {value!r} must be a "
                                  "number of seconds, 0 or more")
        if max_s >= self.tool_timeout_s:
            raise ConfigError(f"rollout.environment.options.max_s: {max_s:g} must be below "
                              f"tool_timeout_s ({self.tool_timeout_s:g}): a call that long "
                              "would be answered as timed out")
        LATENCY.update(median_s=float(median_s), max_s=float(max_s))

    def reset(self, problem: Problem) -> list[dict[str, str]]:
        messages = super().reset(problem)
        at = 1 if messages[0]["role"] == "system" else 0  # after the system message
        return [*messages[:at], *EXAMPLE, *messages[at:]]
