"""The built-in rewards: answer checkers (1 when the answer is the reference, else 0) and
format rewards (the shape of a completion, meant as small bonuses beside a checker)."""

from __future__ import annotations

import functools
import logging
import re

from relayrl.plugins.rewards.registry import register
from relayrl_tasks.rewards.answers import answer_text, boxed_contents, too_large

# Nothing before the reasoning; what the block holds and what follows are checked after.
_THINK_THEN_ANSWER = re.compile(r"\s*<think>(?P<thought>.*?)</think>(?P<answer>.*)", re.DOTALL)
# A word of prose, not a LaTeX command nor a one-letter variable.
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")


@register("exact_match")
def exact_match(completion: str, reference: str) -> float:
    """1 when the completion, stripped, equals the reference, else 0."""
    return 1.0 if completion.strip() == reference.strip() else 0.0


@register("math_verify", requires=(("math_verify", "math-verify==0.9.0"),))
def math_verify(completion: str, reference: str) -> float:
    """1 when the completion's answer equals the reference's, by Hugging Face's math-verify
    (numbers, fractions, percentages, LaTeX, expressions, sets), behind the layer in
    relayrl_tasks.rewards.answers (<think> blocks, the "####" marker, a sign plus, a size guard).

    A reference with no answer is a data error and raises, so it is reported with the sample
    instead of quietly scoring every completion 0. An answer too large to evaluate scores 0,
    and so do two boxed answers (math-verify reads them as the set of both).
    """
    from math_verify import parse, verify  # imports sympy: seconds, so on first use only

    expected = _parse_reference(reference)
    text = answer_text(completion)
    if too_large(text):
        return 0.0
    # timeouts off: math-verify's are signal.alarm, which raises outside the main thread
    answer = parse(text, parsing_timeout=None)
    if not answer:
        return 0.0
    return 1.0 if verify(list(expected), answer, timeout_seconds=None) else 0.0


@functools.lru_cache(maxsize=4096)  # a group's samples share their reference
def _parse_reference(reference: str) -> tuple:
    from math_verify import parse

    _quiet_timeout_warnings()
    text = answer_text(reference)
    if too_large(text):
        raise ValueError(f"math_verify: reference {reference[:80]!r} is too large to evaluate")
    expected = parse(text, parsing_timeout=None)
    if not expected and not _WORD.search(text):  # the bare answer, e.g. \frac{1}{\sqrt{2}}
        expected = parse(f"${text.strip()}$", parsing_timeout=None)
    if not expected:
        raise ValueError(f"math_verify: reference {reference[:80]!r} holds no answer "
                         "math-verify can read")
    return tuple(expected)


@functools.cache
def _quiet_timeout_warnings() -> None:
    """math-verify warns once that its timeouts are off; that is deliberate here (see above)."""
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(
            lambda record: not record.getMessage().startswith("Timeout is disabled"))


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
