"""Rewards from a user's own Python: the spec `package.module:function` (e.g. `my_rewards:score`,
`pkg.sub.mod:fn`, or `mod:obj.method`), imported with importlib when the spec is resolved, so a
bad one fails at start-up with a ValueError saying what went wrong.

The module must be importable by every process that scores (the rollout workers, an
evaluator): installed, on PYTHONPATH, or under the directory the run was started from (the
working directory is searched too, as `python -m` does, so the `relayrl` command finds
`examples.own_task.reward` from the repository root). The function's parameter names decide
how it is called (see relayrl_tasks.rewards.calling):

    def score(completion, reference, metadata): ...        # one completion -> float
    def score(completions, reference, metadata): ...       # a group -> list of floats

`reference` and `metadata` are optional: declare only what you use.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from relayrl_tasks.rewards.calling import CallPlan, Metadata, call_group, call_one, plan_call

_IDENT = r"[^\W\d]\w*"
REF = re.compile(rf"(?P<module>{_IDENT}(?:\.{_IDENT})*):(?P<attr>{_IDENT}(?:\.{_IDENT})*)")


class ImportedReward:
    """A user's function with its calling convention, worked out once."""

    def __init__(self, name: str, fn: Callable, plan: CallPlan):
        self.name, self.fn, self.plan = name, fn, plan

    def __call__(self, completion: str, reference: str, metadata: Metadata | None = None) -> float:
        return call_one(self.fn, completion, reference, metadata, self.plan)

    def group_scores(self, completions: Sequence[str], reference: str,
                     metadata: Metadata | None = None, **seen: Any) -> list[tuple[float, str]]:
        """`seen`: the prompt and conversations, as call_group takes them."""
        return call_group(self.fn, completions, reference, metadata, self.plan, **seen)

    def __repr__(self) -> str:
        kind = "per group" if self.plan.batched else "per completion"
        return f"ImportedReward({self.name!r}, {kind})"


def import_user_module(name: str) -> ModuleType:
    """importlib.import_module with the working directory searched too (last): a console
    script, unlike `python -m`, does not put it on sys.path."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    return importlib.import_module(name)


def load_reward(ref: str, where: str) -> Any:
    """The function `ref` ("package.module:function") names; ValueError naming `where`."""
    match = REF.fullmatch(ref)
    if match is None:
        raise ValueError(f"{where}: {ref!r} is not package.module:function")
    module_name, attr = match["module"], match["attr"]
    try:
        module = import_user_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and (module_name == err.name or module_name.startswith(err.name + ".")):
            raise ValueError(f"{where}: module {module_name!r} not found (install it, or put "
                             "its directory on PYTHONPATH)") from None
        raise ValueError(f"{where}: importing module {module_name!r} raised "
                         f"ModuleNotFoundError: {err}") from err
    except Exception as err:  # a user's module may raise anything while it loads
        raise ValueError(f"{where}: importing module {module_name!r} raised "
                         f"{type(err).__name__}: {err}") from err
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ValueError(f"{where}: module {module_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if isinstance(fn, type):
        raise ValueError(f"{where}: {ref} is a class; name a function, or an instance with "
                         "__call__")
    if hasattr(fn, "group_scores"):  # scores a group itself (a JudgeReward, a weighted sum)
        return fn
    if not callable(fn):
        raise ValueError(f"{where}: {ref} is not callable (it is a {type(fn).__name__})")
    return ImportedReward(ref, fn, plan_call(fn, where, positional=False))
