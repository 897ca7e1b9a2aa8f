"""How a reward function is called, decided once from its parameter names (inspect.signature):
the convention relayrl.plugins.rewards describes, carried out."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from relayrl.plugins.rewards import Metadata, as_reward

EMPTY: Metadata = MappingProxyType({})
_PER_COMPLETION = ("reference", "metadata", "prompt", "conversation")
_PER_GROUP = ("reference", "metadata", "prompt", "prompts", "conversations")
_P = inspect.Parameter
_EXPECTED = ("expected (completion[, reference][, metadata][, prompt][, conversation]) per "
             "completion or (completions[, reference][, metadata][, prompt][, prompts]"
             "[, conversations]) per group")

Prompt = str | Sequence[Mapping[str, str]]
Conversation = Sequence[Mapping[str, str]]


def conversation_of(prompt: Prompt, completion: str) -> tuple[dict[str, str], ...]:
    """A one-turn conversation: the prompt's messages (its text as a user message), then the
    completion as the assistant's."""
    opening = ([{"role": "user", "content": prompt}] if isinstance(prompt, str)
               else [dict(m) for m in prompt])
    return (*opening, {"role": "assistant", "content": completion})


@dataclass(frozen=True)
class CallPlan:
    """How a reward function is called, worked out once from its parameters."""
    batched: bool  # one call per group with the list of completions
    by_name: bool  # else the positional (completion, reference) form
    extras: frozenset[str]  # which of reference, metadata, prompt, ... go by keyword


def plan_call(fn: Callable, where: str, positional: bool = True) -> CallPlan:
    """How to call `fn`; ValueError naming `where` and the parameters found when no form fits.
    `positional` allows the older (completion, reference) form under other names."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: cannot read the parameters of {fn!r}: {err}") from None
    params = list(sig.parameters.values())
    plan = _by_name(params)
    if plan is None and positional:
        plan = _positional(sig)
    if plan is None:
        found = ", ".join(str(p) for p in params)
        raise ValueError(f"{where}: parameters ({found}) fit no calling convention; {_EXPECTED}")
    return plan


def _by_name(params: list[inspect.Parameter]) -> CallPlan | None:
    if not params or params[0].kind not in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD) \
            or params[0].name not in ("completion", "completions"):
        return None
    takes_any = any(p.kind is _P.VAR_KEYWORD for p in params)
    named = {p.name for p in params[1:] if p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)}
    batched = params[0].name == "completions"
    extras = frozenset(e for e in (_PER_GROUP if batched else _PER_COMPLETION)
                       if e in named or takes_any)
    for p in params[1:]:
        if p.default is p.empty and p.kind not in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD) \
                and p.name not in extras:
            return None  # a required parameter nobody would pass
    return CallPlan(batched=batched, by_name=True, extras=extras)


def _positional(sig: inspect.Signature) -> CallPlan | None:
    for extras in (frozenset({"metadata"}), frozenset()):
        try:
            sig.bind(None, None, **dict.fromkeys(extras))
        except TypeError:
            continue
        return CallPlan(batched=False, by_name=False, extras=extras)
    return None


def readonly(metadata: Metadata | None) -> Metadata:
    """`metadata` as a read-only mapping (empty for None)."""
    if metadata is None:
        return EMPTY
    return metadata if isinstance(metadata, MappingProxyType) else MappingProxyType(dict(metadata))


def call_one(fn: Callable, completion: str, reference: str, metadata: Metadata | None = None,
             plan: CallPlan | None = None, prompt: Prompt = "",
             conversation: Conversation | None = None) -> float:
    """fn's reward for one completion; raises what fn raises."""
    plan = plan or plan_call(fn, f"reward {name_of(fn)}")
    conversation = conversation or conversation_of(prompt, completion)
    if plan.batched:
        kwargs = _extras(plan, reference, readonly(metadata), prompt, [conversation], 1)
        return checked_batch(fn([completion], **kwargs), 1)[0]
    kwargs = {k: v for k, v in {"reference": reference, "metadata": readonly(metadata),
                                "prompt": prompt, "conversation": conversation}.items()
              if k in plan.extras}
    if plan.by_name:
        return as_reward(fn(completion, **kwargs))
    return as_reward(fn(completion, reference, **kwargs))


def call_group(fn: Callable, completions: Sequence[str], reference: str,
               metadata: Metadata | None = None, plan: CallPlan | None = None,
               prompt: Prompt = "", conversations: Sequence[Conversation] | None = None
               ) -> list[tuple[float, str]]:
    """(reward, error) per completion, unchecked for range; never raises. Objects with a
    `group_scores` method (weighted sums, remote and imported rewards) score themselves.
    `conversations`: each completion's whole conversation; by default its prompt and it."""
    n = len(completions)
    if n == 0:
        return []
    metadata = readonly(metadata)
    if conversations is None:
        conversations = [conversation_of(prompt, c) for c in completions]
    assert len(conversations) == n, f"{len(conversations)} conversations for {n} completions"
    try:
        group_scores = getattr(fn, "group_scores", None) if plan is None else None
        if group_scores is not None:
            results = list(group_scores(completions, reference, metadata, prompt=prompt,
                                        conversations=conversations))
            assert len(results) == n, f"{name_of(fn)}.group_scores: {len(results)} for {n}"
            return results
        plan = plan or plan_call(fn, f"reward {name_of(fn)}")
        if plan.batched:
            kwargs = _extras(plan, reference, metadata, prompt, conversations, n)
            return [(value, "") for value in checked_batch(fn(list(completions), **kwargs), n)]
    except Exception as err:  # a user's reward function may raise anything
        return [(0.0, describe(err))] * n
    results = []
    for completion, conversation in zip(completions, conversations, strict=True):
        try:
            results.append((call_one(fn, completion, reference, metadata, plan, prompt,
                                     conversation), ""))
        except Exception as err:
            results.append((0.0, describe(err)))
    return results


def checked_batch(result: Any, n: int) -> list[float]:
    """A batched function's result as n floats; ValueError saying what is wrong otherwise."""
    if isinstance(result, str | bytes | Mapping) or not hasattr(result, "__len__"):
        raise ValueError(f"batched reward returned {type(result).__name__}, expected a "
                         f"sequence of {n} numbers")
    if len(result) != n:
        raise ValueError(f"batched reward returned {len(result)} values for {n} completions")
    values = []
    for i, item in enumerate(result):
        try:
            values.append(as_reward(item))
        except TypeError:
            raise ValueError(f"batched reward returned a non-number at [{i}]: "
                             f"{type(item).__name__} {item!r:.80}") from None
    return values


def describe(err: BaseException) -> str:
    """An exception as a sample's error text: `Type: message`."""
    return f"{type(err).__name__}: {err}"


def name_of(fn: Callable) -> str:
    """A reward's name for messages: its `name`, `__name__` or repr."""
    return getattr(fn, "name", None) or getattr(fn, "__name__", None) or repr(fn)


def _extras(plan: CallPlan, reference: str, metadata: Metadata, prompt: Prompt,
            conversations: Sequence[Conversation], n: int) -> dict[str, Any]:
    """A batched function's keyword arguments, those it declares."""
    given = {"reference": reference, "metadata": metadata, "prompt": prompt,
             "prompts": [prompt] * n, "conversations": list(conversations)}
    return {key: given[key] for key in plan.extras}
