"""Tied parameters travel once. A model whose output projection is its input embedding
(SmolLM2, the tiny model: `tie_word_embeddings`) names that one tensor twice in its state
dict, and a version carrying both names would move it twice: 113 MB of SmolLM2's 651. The
trainer publishes each tensor under its first name only. A torch model fills the alias by
loading the first name, since both name the same parameter; vLLM's reload, which wants every
name, is handed the alias again, in process."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """Each name in `model.state_dict()` whose tensor an earlier name already holds, mapped
    to that first name. Works on any device, meta included (tensors are matched by
    identity, not by address)."""
    first: dict[int, str] = {}
    aliases = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in first:
            aliases[name] = first[id(tensor)]
        else:
            first[id(tensor)] = name
    return aliases


def tie(model: nn.Module, aliases: Mapping[str, str]) -> None:
    """Make each alias name its first name's tensor again: a conversion that gives every
    module tensors of its own (to_empty off the meta device) unties them."""
    for alias, name in aliases.items():
        owner, _, leaf = alias.rpartition(".")
        tensor = (model.get_parameter(name) if name in dict(model.named_parameters())
                  else model.get_buffer(name))
        setattr(model.get_submodule(owner), leaf, tensor)


def without(state: dict[str, torch.Tensor], aliases: Mapping[str, str]
            ) -> dict[str, torch.Tensor]:
    """`state` less the alias names (a version published with them is accepted too)."""
    return {k: v for k, v in state.items() if k not in aliases} if aliases else state


def with_aliases(state: dict[str, torch.Tensor], aliases: Mapping[str, str]
                 ) -> dict[str, torch.Tensor]:
    """`state` with each alias naming its first name's tensor again, for a loader (vLLM's)
    that wants every name."""
    return {**state, **{alias: state[name] for alias, name in aliases.items()}}


def check_state_dict(current: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor],
                     version: int) -> None:
    """Refuse a version whose names, shapes or dtypes differ from the model's."""
    missing, extra = set(current) - set(tensors), set(tensors) - set(current)
    if missing or extra:
        raise ValueError(f"version {version}: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(extra)[:5]}")
    for name, t in tensors.items():
        if current[name].shape != t.shape or current[name].dtype != t.dtype:
            raise ValueError(f"version {version}: shard {name} is {t.dtype}{tuple(t.shape)}, "
                             f"model has {current[name].dtype}{tuple(current[name].shape)}")


def load_published(model: nn.Module, state: dict[str, torch.Tensor],
                   aliases: Mapping[str, str] | None = None) -> None:
    """Load a published version into `model`, strictly but for its tied aliases, which
    load with their first names. `aliases`: tied_aliases(model), when the caller keeps it."""
    aliases = tied_aliases(model) if aliases is None else aliases
    missing, unexpected = model.load_state_dict(without(state, aliases), strict=False)
    missing = [k for k in missing if k not in aliases]
    if missing or unexpected:
        raise ValueError(f"weights: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
