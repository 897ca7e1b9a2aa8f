"""A problem as every task hands it out, and how a record's fields become its prompt.

A problem's prompt is raw text the model continues, or chat messages the model's chat
template lays out (`LoadedModel.encode_problem`). Its reference is what the reward checks the
answer against; its metadata (every field of the record, JSON values) goes to rewards that
ask for it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from relayrl.config.task import PromptConfig

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Problem:
    """One prompt as a task hands it out: its text or messages, reference and metadata."""
    prompt_id: int
    text: str  # a raw prompt; "" when the prompt is chat messages
    reference: str
    messages: tuple[Mapping[str, str], ...] = ()  # [{role, content}], laid out by the template
    metadata: Mapping[str, Any] = field(default_factory=dict)


class BadRecord(ValueError):
    """A record that cannot become a problem; the message names the field."""


def build_prompt(cfg: PromptConfig, record: Mapping[str, Any]
                 ) -> tuple[str, tuple[dict[str, str], ...]]:
    """(text, messages) of a record under `cfg`: one of the two is empty."""
    if cfg.messages_field:
        turns = list(check_messages(record.get(cfg.messages_field), cfg.messages_field))
        if cfg.system and turns[0]["role"] != "system":
            turns.insert(0, {"role": "system", "content": cfg.system})
        return "", tuple(turns)
    question = _question(cfg, record)
    if cfg.format == "raw":
        shots = "".join(f"{s.prompt}{s.answer}\n\n" for s in cfg.few_shot)
        system = f"{cfg.system}\n\n" if cfg.system else ""
        return system + shots + question, ()
    turns = [{"role": "system", "content": cfg.system}] if cfg.system else []
    for shot in cfg.few_shot:
        turns += [{"role": "user", "content": shot.prompt},
                  {"role": "assistant", "content": shot.answer}]
    turns.append({"role": "user", "content": question})
    return "", tuple(turns)


def _question(cfg: PromptConfig, record: Mapping[str, Any]) -> str:
    if cfg.template:
        try:
            text = cfg.template.format_map(record)
        except KeyError as err:
            raise BadRecord(f"field {err.args[0]!r} (named in task.prompt.template) is "
                            "missing") from None
        except (IndexError, ValueError, AttributeError) as err:
            raise BadRecord(f"task.prompt.template cannot be filled: {err}") from None
    else:
        text = record.get(cfg.field)
        if not isinstance(text, str):
            raise BadRecord(f"field {cfg.field!r} (task.prompt.field) is "
                            f"{_what(text)}, not text")
    if not text.strip():
        raise BadRecord("the prompt is empty")
    return text


def check_messages(value: Any, name: str) -> tuple[dict[str, str], ...]:
    """Chat messages as a task or environment gave them, checked; ValueError naming the
    field."""
    if not isinstance(value, list) or not value:
        raise BadRecord(f"field {name!r} is {_what(value)}, not a non-empty list of messages")
    turns = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping) or not isinstance(m.get("content"), str) \
                or m.get("role") not in ROLES:
            raise BadRecord(f"field {name!r}[{i}] is not a {{role, content}} message with a "
                            f"role among {ROLES}")
        turns.append({"role": m["role"], "content": m["content"]})
    if turns[-1]["role"] == "assistant":
        raise BadRecord(f"field {name!r} ends with an assistant message: nothing to answer")
    return tuple(turns)


def reference_of(record: Mapping[str, Any], name: str) -> str:
    """A record's answer field as the reference text; BadRecord when it has none."""
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, str | int | float) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise BadRecord(f"field {name!r} (task.answer_field) is {_what(value)}, not text or "
                        "a finite number")
    return str(value)


def metadata_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """Every field of the record, its prompt and answer columns too, as JSON values: what a
    reward receives as `metadata`, as TRL's reward functions receive the dataset's
    columns."""
    try:  # through JSON once, so every process sees the same plain values
        return json.loads(json.dumps(dict(record), default=str, allow_nan=False))
    except ValueError as err:
        raise BadRecord(f"a metadata field is not JSON ({err})") from None


def _what(value: Any) -> str:
    return "missing" if value is None else f"a {type(value).__name__}"


class Task(Protocol):
    """What every task gives: its problems by prompt id, and its held-out set."""
    reward_name: str

    def problem(self, prompt_id: int) -> Problem:
        """Training problem `prompt_id` (>= 0): the same problem for the same id, always."""

    def eval_problems(self) -> list[Problem]:
        """The held-out problems (ids -1, -2, ...), never among the training ones."""
