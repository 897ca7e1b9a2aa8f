"""What math-verify lacks, as a thin layer in front of it (see builtin.math_verify).

- Text inside <think>...</think> is never the answer; a block opened and never closed (a
  completion cut off while reasoning) holds no answer either.
- The GSM8K final-answer marker: without a \\boxed{...}, the answer is the first line after the
  last "####".
- A sign plus ("x = +7"), which math-verify does not read as a number.
- A guard against answers sympy would evaluate for minutes or forever (9^{9^9} has 370 million
  digits), since math-verify runs here without its signal-based timeouts.
"""

from __future__ import annotations

import re

_BOX = "\\boxed{"
_MARKER = "####"
# A plus right after a start, space, '=' or opening bracket, and right before a digit.
_SIGN_PLUS = re.compile(r"(?:^|(?<=[\s=(\[{:,]))\+(?=\d)")
# A power's exponent: a braced group (one level of braces inside), a bracketed group, a number.
_POWER = re.compile(r"(?:\^|\*\*)\s*(\{(?:[^{}]|\{[^{}]*\})*\}|\([^()]*\)|[\w.]+)")
_TOWER = re.compile(r"\s*(?:\^|\*\*)")
_FACTORIAL = re.compile(r"(\d[\d,]*|\{(?:[^{}]|\{[^{}]*\})*\}|\([^()]*\))\s*!")
_BIG_EXPONENT = re.compile(r"\d{5,}")  # 2^{100000} alone costs sympy seconds
_BIG_FACTORIAL = re.compile(r"\d{6,}")


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
    """The part of a completion outside its reasoning block."""
    end = text.rfind("</think>")
    if end != -1:
        text = text[end + len("</think>"):]
    start = text.find("<think>")
    return text if start == -1 else text[:start]


def answer_text(text: str) -> str:
    """The text math-verify should look for the answer in."""
    text = after_thinking(text)
    hashes = text.rfind(_MARKER)
    if hashes != -1 and not boxed_contents(text):
        rest = text[hashes + len(_MARKER):]
        text = next((line for line in rest.splitlines() if line.strip()), "")
    return _SIGN_PLUS.sub("", text)


def too_large(text: str) -> bool:
    """True when `text` holds a power tower, a power whose exponent has 5 digits or more, or
    a factorial of a power, a factorial or a 6-digit number. Best effort: it catches what a
    model writes by accident, not every expression that is slow to evaluate."""
    for power in _POWER.finditer(text):
        exponent = power[1]
        if ("^" in exponent or "**" in exponent or "!" in exponent
                or _BIG_EXPONENT.search(exponent.replace(",", ""))
                or _TOWER.match(text, power.end())):
            return True
    for factorial in _FACTORIAL.finditer(text):
        operand = factorial[1]
        if ("^" in operand or "**" in operand or "!" in operand
                or _BIG_FACTORIAL.search(operand.replace(",", ""))):
            return True
    return False
