"""The built-in rewards: answer checkers (1 when the answer is the reference, else 0) and
format rewards (the shape of a completion, meant as small bonuses beside a checker)."""

from __future__ import annotations

import re

from relayrl.rewards.answers import boxed_contents, final_answer, same_number
from relayrl.rewards.registry import register

MATH_REL_TOL = 1e-6

# Nothing before the reasoning; what the block holds and what follows are checked after.
_THINK_THEN_ANSWER = re.compile(r"\s*<think>(?P<thought>.*?)</think>(?P<answer>.*)", re.DOTALL)


@register("exact_match")
def exact_match(completion: str, reference: str) -> float:
    return 1.0 if completion.strip() == reference.strip() else 0.0


@register("math_verify")
def math_verify(completion: str, reference: str) -> float:
    """1 when the completion's final number equals the reference's, see relayrl.rewards.answers.

    A reference with no number is a data error and raises, so it is reported with the sample
    instead of quietly scoring every completion 0.
    """
    expected = final_answer(reference)
    if expected is None:
        raise ValueError(f"math_verify: reference {reference[:80]!r} holds no number")
    answer = final_answer(completion)
    if answer is None:
        return 0.0
    matched = any(same_number(a, e, MATH_REL_TOL) for a in answer for e in expected)
    return 1.0 if matched else 0.0


@register("format_boxed")
def format_boxed(completion: str, reference: str) -> float:
    """1 when the completion has exactly one \\boxed{...} and it is not empty."""
    if completion.count("\\boxed") != 1:
        return 0.0
    boxes = boxed_contents(completion)
    return 1.0 if len(boxes) == 1 and boxes[0].strip() else 0.0


@register("format_think")
def format_think(completion: str, reference: str) -> float:
    """1 for `<think>reasoning</think>answer`: one non-empty reasoning block, then a non-empty
    answer."""
    if completion.count("<think>") != 1 or completion.count("</think>") != 1:
        return 0.0
    match = _THINK_THEN_ANSWER.fullmatch(completion)
    if match is None:
        return 0.0
    return 1.0 if match["thought"].strip() and match["answer"].strip() else 0.0
