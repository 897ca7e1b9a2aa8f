"""Older import paths of the plug-in API, kept working for one more release: each is a small
module of its own (relayrl.envs, relayrl.rewards, relayrl.tasks, relayrl.buffer_client,
relayrl.models.chat and their submodules) that gives its new module's names, the same
objects, and warns once, when it is first imported, where to import them from."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any


def alias(old: str, new: ModuleType, elsewhere: dict[str, str] | None = None
          ) -> tuple[Callable[[str], Any], list[str]]:
    """For the module `old`, an older path of `new`: warn that it moved (a DeprecationWarning
    at the line that imports it) and return its `__getattr__`, which gives `new`'s names, and
    its `__all__`. A name `old` gave that lives in another module now (`elsewhere`: name ->
    that module) is refused naming the module, with an ImportError: `from old import name`
    would otherwise replace an AttributeError's message by its own, which names neither."""
    elsewhere = elsewhere or {}
    warnings.warn(f"{old} moved to {new.__name__}; import it from there", DeprecationWarning,
                  stacklevel=3)

    def __getattr__(name: str) -> Any:
        if name in elsewhere:
            raise ImportError(f"cannot import name {name!r} from {old!r}: it moved to "
                              f"{elsewhere[name]}; import it from there", name=old)
        try:
            return getattr(new, name)
        except AttributeError:
            raise AttributeError(f"module {old!r} ({new.__name__} now) has no attribute "
                                 f"{name!r}") from None

    names = getattr(new, "__all__", None) or [n for n in vars(new) if not n.startswith("_")]
    return __getattr__, list(names)
