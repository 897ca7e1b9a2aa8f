"""Finding the final answer in a completion and reading it as a number.

Where the answer is, in order: the last \\boxed{...}, else the first number after the last
"####" (GSM8K style), else the last number in the text. Text inside <think>...</think> is
never the answer. Numbers are read exactly (as Fractions): integers, decimals, a/b,
\\frac{a}{b}, thousands separators ("1,234"), a leading sign, a trailing percent.
"""

from __future__ import annotations

import re
from fractions import Fraction

_DIGITS = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
# Not inside a word or after another number's digits: the minus of "3-5" is no sign, the
# 2 of "H2O" no number, and "1,2345" is 1 and 2345 rather than 1,234 and a stray 5.
_NUMBER = re.compile(
    rf"(?<![\w.])(?P<sign>[-+])?(?P<num>{_DIGITS})(?!\d)"
    rf"(?:\s*/\s*(?P<den>{_DIGITS})(?!\d))?(?P<pct>\s*%)?"
)
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_BOX = "\\boxed{"
_LATEX_NOISE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\$", "$")


def boxed_contents(text: str) -> list[str]:
    """The contents of every well-formed \\boxed{...}, braces inside matched, in order."""
    found = []
    start = text.find(_BOX)
    while start != -1:
        depth, end = 0, -1
        for i in range(start + len(_BOX) - 1, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    end = i
                    break
        if end == -1:  # never closed: a later box may still be whole
            start = text.find(_BOX, start + 1)
            continue
        found.append(text[start + len(_BOX):end])
        start = text.find(_BOX, end + 1)
    return found


def after_thinking(text: str) -> str:
    """The part of a completion after its reasoning block, if it has one."""
    end = text.rfind("</think>")
    return text if end == -1 else text[end + len("</think>"):]


def _normalize(text: str) -> str:
    text = text.replace("{,}", ",").replace("\\%", "%")
    for noise in _LATEX_NOISE:
        text = text.replace(noise, "")
    return _FRAC.sub(r"(\1)/(\2)", text).replace("(", "").replace(")", "")


def _read(match: re.Match[str]) -> list[Fraction] | None:
    """Every value the matched number may mean: with a percent sign, both 50 and 0.5."""
    value = Fraction(match["num"].replace(",", ""))
    if match["den"] is not None:
        den = Fraction(match["den"].replace(",", ""))
        if den == 0:
            return None
        value /= den
    if match["sign"] == "-":
        value = -value
    return [value, value / 100] if match["pct"] else [value]


def numbers(text: str) -> list[list[Fraction]]:
    """Every number in `text`, in order, each as the list of values it may mean."""
    read = (_read(m) for m in _NUMBER.finditer(_normalize(text)))
    return [values for values in read if values is not None]


def final_answer(text: str) -> list[Fraction] | None:
    """The values the final answer may mean, or None when there is no numeric answer."""
    text = after_thinking(text)
    boxes = boxed_contents(text)
    if boxes:
        # a boxed answer is a commitment: if it holds no number, there is no numeric answer
        found = numbers(boxes[-1])
        return found[-1] if found else None
    hashes = text.rfind("####")
    if hashes != -1:
        found = numbers(text[hashes + len("####"):])
        return found[0] if found else None
    found = numbers(text)
    return found[-1] if found else None


def same_number(a: Fraction, b: Fraction, rel_tol: float) -> bool:
    """Integers must agree exactly (so 1000000 is not 1000001); others within rel_tol."""
    if a == b:
        return True
    if a.denominator == 1 and b.denominator == 1:
        return False
    return abs(a - b) <= Fraction(rel_tol) * max(abs(a), abs(b))
