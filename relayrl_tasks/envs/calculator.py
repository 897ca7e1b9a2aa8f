"""A calculator tool for arithmetic word problems: the built-in example environment.

The model may write `<calc>12*7</calc>` in its reply; the environment answers with a message
holding `<result>84</result>`, and the model goes on. The episode ends when the model replies
without a tool call (that reply is its answer, scored against the problem's reference by
`reward`, math_verify by default), or at rollout.environment.max_turns.

    rollout:
      environment: {cls: calculator, max_turns: 4}   # relayrl_tasks.envs.calculator:Calculator

Expressions are parsed with `ast` and evaluated node by node over numbers and + - * / // %
** only: no names, calls or attributes, and no result past MAX_BITS (`9**9**9` is refused,
not computed), so a hostile expression costs microseconds and can raise nothing.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Sequence

from relayrl.plugins.envs.protocol import Environment, Message, Step
from relayrl.plugins.tasks.problem import Problem

CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
MAX_CHARS = 200  # of one expression: also bounds the parser's nesting depth
MAX_BITS = 1024  # of an integer result
MAX_FLOAT = 1e300  # magnitude of a float result
INSTRUCTIONS = ("You may use a calculator: write <calc>expression</calc> (numbers and "
                "+ - * / // % ** and parentheses) and you will get <result>value</result>. "
                "When you know the answer, reply with it and no calculator call.")

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalcError(ValueError):
    """An expression the calculator refuses; the message is what the model is told."""


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression, or CalcError."""
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)  # 1,000 is a thousand
    if not text:
        raise CalcError("empty expression")
    if len(text) > MAX_CHARS:
        raise CalcError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalcError("not an arithmetic expression") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
        except (OverflowError, ValueError):
            raise CalcError("result too large") from None
        return _checked(value)
    raise CalcError("only numbers, + - * / // % ** and parentheses are allowed")


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse a power whose result would pass MAX_BITS before computing it."""
    if base == 0 and exponent < 0:
        raise CalcError("division by zero")
    if isinstance(exponent, float) and base < 0 and not exponent.is_integer():
        raise CalcError("fractional power of a negative number")
    size = abs(exponent) * math.log2(abs(base)) if abs(base) > 1 else 0.0
    if size > MAX_BITS:
        raise CalcError("result too large")


def _checked(value: int | float) -> int | float:
    if isinstance(value, complex):
        raise CalcError("result is not a real number")
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise CalcError("result too large")
    if isinstance(value, float) and (not math.isfinite(value) or abs(value) > MAX_FLOAT):
        raise CalcError("result too large")
    return value


def show(value: int | float) -> str:
    """A result as the model reads it: 42 rather than 42.0, 0.3333333333 rather than more."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return f"{value:.10g}" if isinstance(value, float) else str(value)


class Calculator(Environment):
    """Options: `reward` (a reward spec, relayrl.plugins.rewards), `role` of the result messages,
    `instructions` (put INSTRUCTIONS in a system message before the task's prompt)."""

    def __init__(self, reward: str = "math_verify", role: str = "user",
                 instructions: bool = True):
        from relayrl_tasks.rewards import get_reward

        self.reward_fn = get_reward(reward)
        self.role = role
        self.instructions = instructions
        self.reference = ""
        self.calls = 0

    def reset(self, problem: Problem) -> Sequence[Message] | None:
        """Remember the problem's reference; with `instructions`, open the episode with
        them in a system message before the task's prompt (otherwise the prompt as it is)."""
        self.reference = problem.reference
        if not self.instructions:
            return None
        turns = [dict(m) for m in problem.messages] or [{"role": "user", "content":
                                                         problem.text}]
        if turns[0]["role"] == "system":
            turns[0]["content"] = f"{turns[0]['content']}\n\n{INSTRUCTIONS}"
        else:
            turns.insert(0, {"role": "system", "content": INSTRUCTIONS})
        return turns

    def step(self, message: str) -> Step:
        """Answer each `<calc>...</calc>` call in the model's message with its result; a
        message without a call is the final answer, scored by the reward, and ends the episode."""
        from relayrl_tasks.rewards import score

        calls = CALL.findall(message)
        if not calls:  # the final answer
            reward, _ = score(self.reward_fn, message, self.reference)
            return Step((), reward, True)
        self.calls += len(calls)
        results = []
        for expression in calls:
            try:
                results.append(f"<result>{show(evaluate(expression))}</result>")
            except CalcError as err:
                results.append(f"<result>error: {err}</result>")
        return Step(({"role": self.role, "content": "\n".join(results)},), None, False)
