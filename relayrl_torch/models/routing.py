"""Routing replay for mixtures of experts: each token's experts, recorded where it was sampled
and replayed where it is trained.

A mixture-of-experts layer sends each token to the top-k experts its router scores highest.
Two computations of the same tokens (the engine in bfloat16 with a KV cache, the trainer in
float32 over whole sequences) round differently, and where two experts' scores nearly tie
the top-k flips: the token runs through another expert and its log-probability moves far more
than rounding alone would move it. Routing replay (R3) records the engine's choice and makes
the trainer's forward take it: the router's top-k is replaced by the recorded experts, and
the routing weights are still computed from the router's logits, over those experts, so the
router keeps its gradient.

Routes are [layers, tokens, top_k] expert indices, one row per mixture-of-experts layer in
the model's order (`routers`), one column per position the engine fed: a sequence's prompt
and its response but the last token, which is sampled and never fed (what vLLM's
routed_experts holds, transposed). The trainer's batch holds them per row as
[L, layers, top_k] with -1 where nothing was recorded (padding, a row's last position, a
sample that carries none): there the router chooses itself.

The hooks work on the routers of Hugging Face's mixture-of-experts blocks (Qwen2-MoE,
Qwen3-MoE, Mixtral, ...): a `*TopKRouter` module returning (router_logits, routing_weights,
selected_experts) for the block's flattened tokens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

__all__ = ["RouteRecorder", "expert_count", "replayed", "route_dtype", "routers"]


def routers(model: nn.Module) -> list[nn.Module]:
    """The model's top-k routers, one per mixture-of-experts layer, in layer order; [] for a
    dense model."""
    return [m for m in model.modules()
            if type(m).__name__.endswith("TopKRouter") and hasattr(m, "top_k")
            and hasattr(m, "num_experts")]


def expert_count(model: nn.Module) -> tuple[int, int, int]:
    """(mixture-of-experts layers, experts per layer, top_k): (0, 0, 0) for a dense model."""
    found = routers(model)
    if not found:
        return 0, 0, 0
    return len(found), int(found[0].num_experts), int(found[0].top_k)


def route_dtype(num_experts: int) -> np.dtype:
    """The compact dtype expert indices travel in: uint8 up to 256 experts, else int16."""
    return np.dtype(np.uint8) if num_experts <= 256 else np.dtype(np.int16)


class RouteRecorder:
    """Records the experts each forward pass of `model` chose, for the sampler to assign to
    its sequences (relayrl_torch.sampling.sampler): hooks on the routers while entered;
    after each forward `step(fed, rows)` keeps that pass's choices for the tokens `fed` marks,
    and `routes(i)` gives row i's [layers, tokens, top_k] in the order they were fed."""

    def __init__(self, model: nn.Module):
        self.routers = routers(model)
        if not self.routers:
            raise ValueError(f"routes: {model.config.model_type} has no mixture-of-experts "
                             "routers to record")
        self.dtype = route_dtype(int(self.routers[0].num_experts))
        self._last: list[torch.Tensor | None] = [None] * len(self.routers)
        self._steps: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._handles: list = []

    def __enter__(self) -> RouteRecorder:
        self._steps.clear()
        for layer, router in enumerate(self.routers):
            self._handles.append(router.register_forward_hook(self._hook(layer)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, layer: int):
        def keep(module, args, output):
            self._last[layer] = output[2]
        return keep

    def step(self, fed: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """After a forward over [b, t] tokens: keep its experts where `fed` ([b, t] bool) is
        true; `rows` ([B] indices into the b) when the pass ran each distinct row once."""
        b, t = fed.shape
        chosen = torch.stack(self._last).view(len(self.routers), b, t, -1)
        if rows is not None:
            chosen, fed = chosen[:, rows], fed[rows]
        self._steps.append((chosen.to(torch.int16), fed))
        self._last = [None] * len(self.routers)

    def routes(self) -> list[np.ndarray]:
        """Every row's [layers, tokens fed, top_k], in the compact dtype."""
        if not self._steps:
            return []
        chosen = torch.cat([c for c, _ in self._steps], dim=2).cpu()
        fed = torch.cat([f for _, f in self._steps], dim=1).cpu()
        return [chosen[:, i, fed[i]].numpy().astype(self.dtype)
                for i in range(fed.shape[0])]


def _replay_hook(chosen: torch.Tensor):
    """A router forward hook giving `chosen` ([tokens, top_k], -1: the router's own pick) as
    the selected experts, weighted as the router weighs its own: the softmax of its logits
    in float32, taken at those experts, renormalised when the router renormalises its top-k
    (Mixtral always does; Qwen's routers when norm_topk_prob), in the dtype it returns."""
    def replace(module, args, output):
        logits, weights, own = output
        assert chosen.shape == own.shape, (tuple(chosen.shape), tuple(own.shape))
        experts = torch.where(chosen >= 0, chosen.to(own.dtype), own)
        probs = torch.softmax(logits.float(), dim=-1).gather(-1, experts)
        if getattr(module, "norm_topk_prob", True):
            probs = probs / probs.sum(dim=-1, keepdim=True)
        return logits, probs.to(weights.dtype), experts
    return replace


@contextlib.contextmanager
def replayed(model: nn.Module, routes: torch.Tensor | None) -> Iterator[None]:
    """While inside, a forward over [b, t] tokens routes them as `routes` ([b, t, layers,
    top_k], -1 where the router chooses itself) says; routes None or with no layers (a
    dense model, a batch that carries none): the model routes itself."""
    if routes is None or routes.shape[2] == 0 or not (routes >= 0).any():
        yield
        return
    found = routers(model)
    if len(found) != routes.shape[2]:
        raise ValueError(f"routes: {routes.shape[2]} layers of experts for a model with "
                         f"{len(found)} mixture-of-experts layers")
    handles = [router.register_forward_hook(
        _replay_hook(routes[:, :, layer].reshape(-1, routes.shape[3]).long()))
        for layer, router in enumerate(found)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
