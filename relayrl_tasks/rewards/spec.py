"""Reward specs: how a config names a reward, alone or as a weighted sum.

    spec   := term ("+" term)*
    term   := [weight "*"] ref          weight: a finite number, default 1
    ref    := NAME                      a registered reward, e.g. math_verify
            | "remote:" HOST ":" PORT   a reward server, see relayrl_tasks.rewards.remote
            | MODULE ":" FUNCTION       a user's Python, see relayrl_tasks.rewards.imported

e.g. "math_verify+0.1*format_boxed", "remote:127.0.0.1:50570+0.1*format_think",
"my_rewards:score+0.1*format_boxed". Spaces around the operators are allowed. Every part is
resolved (modules imported, signatures read) by get_reward, so a bad spec fails at start-up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from relayrl.plugins.rewards.registry import REWARDS, RewardFn, check_installed
from relayrl_tasks.rewards.calling import Metadata, call_group, call_one, name_of, plan_call
from relayrl_tasks.rewards.imported import load_reward
from relayrl_tasks.rewards.remote import RemoteReward

REMOTE_PREFIX = "remote:"


class WeightedReward:
    """sum(weight * fn(completion, reference)). A term that raises fails the whole sum, so a
    partial reward is never mistaken for a real one. Terms may mix batched and per-completion
    functions (relayrl_tasks.rewards.calling); each gets the metadata if it declares it."""

    def __init__(self, terms: Sequence[tuple[float, RewardFn]], name: str = ""):
        if not terms:
            raise ValueError("weighted: needs at least one (weight, reward) term")
        for i, (weight, fn) in enumerate(terms):
            if isinstance(weight, bool) or not isinstance(weight, int | float) \
                    or not math.isfinite(weight):
                raise ValueError(f"weighted: terms[{i}] weight must be a finite number, "
                                 f"got {weight!r}")
            if not callable(fn):
                raise ValueError(f"weighted: terms[{i}] reward must be callable, got {fn!r}")
            if not hasattr(fn, "group_scores"):
                plan_call(fn, f"weighted: terms[{i}]")
        self.terms = [(float(w), fn) for w, fn in terms]
        self.name = name or "+".join(f"{w:g}*{name_of(fn)}" for w, fn in self.terms)

    def __call__(self, completion: str, reference: str, metadata: Metadata | None = None) -> float:
        return sum(w * call_one(fn, completion, reference, metadata) for w, fn in self.terms)

    def group_scores(self, completions: Sequence[str], reference: str,
                     metadata: Metadata | None = None, **seen: Any) -> list[tuple[float, str]]:
        """(sum, error) per completion: the first failing term's error, if any. `seen`: the
        prompt and conversations, as call_group takes them."""
        totals, errors = [0.0] * len(completions), [""] * len(completions)
        for weight, fn in self.terms:
            for i, (value, error) in enumerate(call_group(fn, completions, reference, metadata,
                                                          **seen)):
                errors[i] = errors[i] or error
                totals[i] += weight * value
        return [(0.0, error) if error else (total, "")
                for total, error in zip(totals, errors, strict=True)]

    def __repr__(self) -> str:
        return f"WeightedReward({self.name!r})"


def weighted(*terms: tuple[float, RewardFn]) -> WeightedReward:
    """weighted((1.0, math_verify), (0.1, format_boxed)): the spec's `+`, for Python callers."""
    return WeightedReward(terms)


def get_reward(spec: str) -> RewardFn:
    """The reward function a spec names; ValueError naming the bad part otherwise."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"reward: spec must be a non-empty string, got {spec!r}")
    terms = [_parse_term(term, spec) for term in spec.split("+")]
    if len(terms) == 1 and terms[0][0] == 1.0:
        return terms[0][1]
    return WeightedReward(terms, name=spec.replace(" ", ""))


def _parse_term(term: str, spec: str) -> tuple[float, RewardFn]:
    where = f"reward {spec!r}" if term == spec else f"reward {spec!r}, term {term.strip()!r}"
    if not term.strip():
        raise ValueError(f"reward {spec!r}: empty term (a stray '+'?)")
    parts = term.split("*")
    if len(parts) > 2:
        raise ValueError(f"{where}: expected WEIGHT*NAME, found more than one '*'")
    weight = _parse_weight(parts[0].strip(), where) if len(parts) == 2 else 1.0
    return weight, _resolve(parts[-1].strip(), where)


def _parse_weight(text: str, where: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        raise ValueError(f"{where}: weight {text!r} is not a number") from None
    if not math.isfinite(weight):
        raise ValueError(f"{where}: weight {text!r} must be finite")
    return weight


def _resolve(ref: str, where: str) -> RewardFn:
    if not ref:
        raise ValueError(f"{where}: missing reward name after '*'")
    if ref.startswith(REMOTE_PREFIX):
        try:
            return RemoteReward(ref[len(REMOTE_PREFIX):])
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
    if ":" in ref:
        return load_reward(ref, where)
    if ref not in REWARDS:
        raise ValueError(f"{where}: unknown reward function {ref!r}; known: {sorted(REWARDS)}"
                         f", {REMOTE_PREFIX}HOST:PORT or package.module:function")
    plan_call(REWARDS[ref], where)  # a registered function no form fits fails here, not later
    check_installed(ref, where)
    return REWARDS[ref]
