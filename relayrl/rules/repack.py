"""Which long-tail sequences move where: the repacking rule shared by the live scheduler and
the simulator.

A worker whose unfinished sequences have dwindled to a few long ones (a tail) runs them at a
tiny batch. Repacking hands them to the fullest other workers that have room, so they decode
in one bigger batch there and the emptied worker is free to refresh its weights and take new
prompts. A target must already be fuller than the worker it takes from (ties broken by id),
so sequences only ever consolidate and two workers never trade the same tail back and forth.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Move:
    item: Hashable  # a lease id (live scheduler) or a sequence (simulator)
    size: int  # unfinished sequences it carries
    source: Hashable
    target: Hashable


def repack_wanted(queued: int, may_hand_out_new: bool) -> bool:
    """Whether to plan moves at all: only when no prompt waits to be handed out, neither a
    re-queued one (`queued`) nor a new one under the in-flight cap; idle room is otherwise
    filled by new prompts instead."""
    return not queued and not may_hand_out_new


def is_tail(load: int, capacity: int, repack_below: float) -> bool:
    """True when a worker holds some sequences but no more than `repack_below` of what it can
    run at once."""
    return 0 < load <= int(repack_below * capacity)


def rank_targets(source: Hashable, source_load: int, loads: dict, capacity: int) -> list:
    """Workers that may take sequences from `source`, fullest first: room left, and fuller
    than the source (ties by id)."""
    key = (source_load, source)
    fitting = [w for w, load in loads.items()
               if w != source and load < capacity and (load, w) > key]
    return sorted(fitting, key=lambda w: (-loads[w], w))


def plan_moves(holdings: dict, capacity: int, repack_below: float,
               targets_only: Iterable | None = None) -> list[Move]:
    """Moves that consolidate tail workers onto fuller ones.

    `holdings` maps each worker to its items as (item, size) pairs. Items are never split;
    a worker that cannot be emptied completely keeps what does not fit. `targets_only`, if
    given, limits which workers may receive (e.g. not draining ones)."""
    if capacity < 1:
        raise ValueError(f"capacity: must be >= 1, got {capacity}")
    if not 0 < repack_below <= 1:
        raise ValueError(f"repack_below: must be in (0, 1], got {repack_below}")
    loads = {w: sum(size for _, size in items) for w, items in holdings.items()}
    allowed = set(holdings if targets_only is None else targets_only)
    received: set = set()
    moves: list[Move] = []
    tails = sorted((w for w in holdings if is_tail(loads[w], capacity, repack_below)),
                   key=lambda w: (loads[w], w))
    for source in tails:
        if source in received or loads[source] == 0:
            continue
        for item, size in sorted(holdings[source], key=lambda it: -it[1]):
            candidates = {w: loads[w] for w in allowed if w in loads}
            for target in rank_targets(source, loads[source], candidates, capacity):
                if loads[target] + size <= capacity:
                    moves.append(Move(item, size, source, target))
                    loads[target] += size
                    loads[source] -= size
                    received.add(target)
                    break
    return moves
