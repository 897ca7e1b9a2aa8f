"""What a reward is: a function, registered by name (`@register`) or named by a config's
`package.module:function`, called with the parameters it declares (decided once from their
names; relayrl_tasks.rewards.calling carries it out), returning a real number.

    per completion  fn(completion[, reference][, metadata][, prompt][, conversation])
                    -> number
    per group       fn(completions[, reference][, metadata][, prompt][, prompts]
                       [, conversations]) -> one number per completion

Only the parameters a function declares are passed, by keyword (a `**kwargs` takes them
all). A group's samples share one prompt, so one reference and one metadata: a batched
function (first parameter named `completions`, as TRL's reward functions) is called once per
group with the list of its completions.

- `reference`: the task's answer.
- `metadata`: every field of the task record (its prompt and answer columns too), a
  read-only mapping of str to JSON-like values; its nested lists and dicts are shared, do not
  change them.
- `prompt`: the prompt as the task gave it: its text, or its chat messages (a tuple of
  {"role", "content"} dicts). `prompts` is the same, once per completion, as TRL passes it.
- `conversation`: the whole conversation of one completion as messages, the prompt's and
  the model's (every turn's, and the environment's between them, for a multi-turn
  episode); `conversations` one per completion.

Registered rewards and callables handed to score() directly may also keep the older
positional form `fn(completion, reference)` under any parameter names (`lambda c, r: ...`),
and get `metadata=` as well when they declare it. A `package.module:function` spec must use
the names above (see relayrl_tasks.rewards.imported).
"""
from __future__ import annotations

import importlib.util
import numbers
import re
from collections.abc import Callable, Mapping
from typing import Any

RewardFn = Callable[..., float]
"""(completion, reference) -> reward, or another of the forms above."""

Metadata = Mapping[str, Any]
"""The task record's other columns (str -> JSON-like values), read-only."""

REWARDS: dict[str, RewardFn] = {}
# name -> (module, pip requirement) pairs a reward imports on first use; checked when a spec
# resolves, so a missing library stops the run at start-up instead of scoring every sample 0
REQUIRES: dict[str, tuple[tuple[str, str], ...]] = {}

# Names must stay clear of the spec syntax (`+`, `*`, `remote:`), see relayrl_tasks.rewards.spec.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED = frozenset({"remote"})


def register(name: str,
             requires: tuple[tuple[str, str], ...] = ()) -> Callable[[RewardFn], RewardFn]:
    """Decorator that makes a reward function available to configs under `name`; `requires`:
    (module, pip requirement) pairs it imports lazily."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"reward: name {name!r} must be letters, digits and underscores, "
                         "not starting with a digit")
    if name in RESERVED:
        raise ValueError(f"reward: name {name!r} is reserved")

    def add(fn: RewardFn) -> RewardFn:
        if not callable(fn):
            raise ValueError(f"reward: {name!r} must be registered with a callable, got {fn!r}")
        if name in REWARDS and REWARDS[name] is not fn:
            raise ValueError(f"reward: {name!r} is already registered ({REWARDS[name]!r})")
        REWARDS[name] = fn
        if requires:
            REQUIRES[name] = tuple(requires)
        return fn

    return add


def check_installed(name: str, where: str) -> None:
    """ValueError naming the package when a library reward `name` imports is not installed."""
    for module, requirement in REQUIRES.get(name, ()):
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"{where}: needs the Python package {requirement!r} (module "
                             f"{module!r}), which is not installed here: pip install "
                             f"'{requirement}'")


def as_reward(value: Any) -> float:
    """A reward as a float. Rewards are real numbers: Python's or numpy's, or a tensor or
    array holding one. A bool or a string is refused (TypeError) rather than read as 1.0:
    `True` or `"1.0"` from a reward is a bug in the reward, not a score. Finiteness and
    range are the caller's checks."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()  # a 0-d tensor or array
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"reward returned {type(value).__name__} {value!r:.80}, not a number")
    return float(value)
