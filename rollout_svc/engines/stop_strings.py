"""Stop strings, matched against the decoded text as vLLM matches them
(vllm/v1/engine/detokenizer.py `check_stop_strings`): generation ends at the token whose text
completes the first stop string (the one that completes earliest, ties broken by list order),
that token is the last one kept, and the text returned is cut before the stop string
(vLLM's default, include_stop_str_in_output false).

The torch engine checks a short decoded tail after every token (`TailCheck`), to stop early,
then `first_stop` finds the exact token over the whole decoded text; the streaming
generator calls `first_stop` after each chunk. The vLLM engine passes the strings to vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

MAX_STOP_STRINGS = 16  # in one request (vLLM sets none)
MAX_STOP_CHARS = 256  # in one stop string

Decode = Callable[[Sequence[int]], str]


def check(stops: str | Sequence[str], field: str = "stop") -> tuple[str, ...]:
    """The stop strings (one, or a list) as a tuple; ValueError naming the field, the value
    and the limit."""
    if isinstance(stops, str):
        _check_one(stops, field)
        return (stops,)
    if len(stops) > MAX_STOP_STRINGS:
        raise ValueError(f"{field}: {len(stops)} strings, more than {MAX_STOP_STRINGS}")
    for i, s in enumerate(stops):
        _check_one(s, f"{field}.{i}")
    return tuple(stops)


def _check_one(stop: object, field: str) -> None:
    if not isinstance(stop, str) or not 1 <= len(stop) <= MAX_STOP_CHARS:
        shown = repr(stop) if len(repr(stop)) <= 40 else repr(stop)[:37] + "..."
        size = f" ({len(stop)} characters)" if isinstance(stop, str) else ""
        raise ValueError(f"{field}: must be a string of 1..{MAX_STOP_CHARS} characters, "
                         f"got {shown}{size}")


def earliest(text: str, stops: Sequence[str]) -> tuple[str, int] | None:
    """(the stop string that completes earliest in `text`, where it starts), ties broken by
    list order; None when none occurs."""
    best: tuple[str, int] | None = None
    best_end = -1
    for s in stops:
        at = text.find(s)
        if at != -1 and (best is None or at + len(s) < best_end):
            best, best_end = (s, at), at + len(s)
    return best


def first_stop(decode: Decode, tokens: Sequence[int], stops: Sequence[str]
               ) -> tuple[int, str] | None:
    """(how many tokens to keep, the stop string) when the text of `tokens` holds one: the
    fewest tokens whose text does; None otherwise. One decode when there is none, a binary
    search over prefixes (their texts grow with them) when there is."""
    if not stops or not tokens or earliest(decode(tokens), stops) is None:
        return None
    low, high = 1, len(tokens)  # the text of tokens[:high] holds one
    while low < high:
        mid = (low + high) // 2
        if earliest(decode(tokens[:mid]), stops) is not None:
            high = mid
        else:
            low = mid + 1
    found = earliest(decode(tokens[:high]), stops)
    assert found is not None
    return high, found[0]


def cut(text: str, stop: str | None) -> str:
    """The text returned for a sequence that `stop` ended: everything before it."""
    if not stop:
        return text
    at = text.find(stop)
    return text if at == -1 else text[:at]


class TailCheck:
    """Whether a sequence's newest token completed a stop string, from the decoded text of
    its last few tokens (enough for the longest stop string: a token is at least one
    character, bar a few special and byte tokens, hence the margin)."""

    MARGIN = 8

    def __init__(self, decode: Decode, stops: Sequence[str]):
        self.decode, self.stops = decode, tuple(stops)
        self.window = max(len(s) for s in stops) + self.MARGIN

    def __call__(self, tokens: Sequence[int]) -> bool:
        tail = self.decode(tokens[-self.window:])
        return any(s in tail for s in self.stops)
