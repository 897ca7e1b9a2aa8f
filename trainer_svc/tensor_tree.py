"""A tree of dicts, lists, tuples, tensors and JSON values (an optimizer's state dict, a value
head's weights) as a JSON document plus the flat name-to-tensor mapping safetensors stores.

Each tensor is replaced in the document by {"$tensor": NAME}, NAME being its path in the tree;
a tuple becomes {"$tuple": [...]} and a dict keyed by integers (a one-process optimizer's
state, keyed by parameter position) {"$int_keys": {...}}, so reading gives back the tree that
was written, types and all. Reading builds only these types: no code is named by the files.
"""

from __future__ import annotations

from typing import Any

import torch

TENSOR, TUPLE, INT_KEYS = "$tensor", "$tuple", "$int_keys"
SCALARS = (str, int, float, bool, type(None))


def split(tree: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """`tree` as (a JSON-serializable document, its tensors by name)."""
    tensors: dict[str, torch.Tensor] = {}
    return _split(tree, "", tensors), tensors


def _split(node: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(node, torch.Tensor):
        assert path not in tensors, f"two tensors at {path!r}"
        tensors[path] = node.detach().contiguous()  # safetensors writes contiguous tensors
        return {TENSOR: path}
    if isinstance(node, tuple):
        return {TUPLE: [_split(v, _at(path, i), tensors) for i, v in enumerate(node)]}
    if isinstance(node, list):
        return [_split(v, _at(path, i), tensors) for i, v in enumerate(node)]
    if isinstance(node, dict):
        if node and all(isinstance(k, int) and not isinstance(k, bool) for k in node):
            return {INT_KEYS: {str(k): _split(v, _at(path, k), tensors)
                               for k, v in node.items()}}
        for k in node:
            if not isinstance(k, str) or k.startswith("$"):
                raise TypeError(f"{path or 'the tree'}: key {k!r} is neither all-integer nor a "
                                "string that does not start with $")
        return {k: _split(v, _at(path, k), tensors) for k, v in node.items()}
    if isinstance(node, SCALARS):
        return node
    raise TypeError(f"{path or 'the tree'}: {type(node).__name__} is not stored in a checkpoint")


def join(document: Any, tensors: dict[str, torch.Tensor], source: str) -> Any:
    """The tree `split` gave `document` and `tensors` for; ValueError, naming `source` and the
    place, for a document that refers to a missing tensor or holds an unknown tag."""
    return _join(document, tensors, source, "")


def _join(node: Any, tensors: dict[str, torch.Tensor], source: str, path: str) -> Any:
    if isinstance(node, list):
        return [_join(v, tensors, source, _at(path, i)) for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    tags = [k for k in node if k.startswith("$")]
    if not tags:
        return {k: _join(v, tensors, source, _at(path, k)) for k, v in node.items()}
    tag, value = tags[0], node[tags[0]]
    if len(node) != 1 or tag not in (TENSOR, TUPLE, INT_KEYS):
        raise ValueError(f"{source}: {path or '/'} holds {sorted(node)!r}; a tagged value is "
                         f"one of {TENSOR}, {TUPLE}, {INT_KEYS} alone")
    if tag == TENSOR:
        if not isinstance(value, str) or value not in tensors:
            raise ValueError(f"{source}: {path or '/'} names tensor {value!r}, which the "
                             "tensor file lacks")
        return tensors[value]
    if tag == TUPLE and isinstance(value, list):
        return tuple(_join(v, tensors, source, _at(path, i)) for i, v in enumerate(value))
    if tag == INT_KEYS and isinstance(value, dict) and all(_is_int(k) for k in value):
        return {int(k): _join(v, tensors, source, _at(path, k)) for k, v in value.items()}
    raise ValueError(f"{source}: {path or '/'}: {tag} holds {type(value).__name__} "
                     f"{str(value)[:80]!r}, not what {tag} takes")


def _at(path: str, key: Any) -> str:
    return f"{path}/{key}" if path else str(key)


def _is_int(key: str) -> bool:
    return key.lstrip("-").isdigit()
