"""Group assembly and batch packing, with no I/O: fed stream entries, it says what to emit
and which entries may be acknowledged."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from relayrl.messages import Batch, Group, Sample


@dataclass
class ReadyBatch:
    batch: Batch
    entry_ids: list[bytes]  # trajectory entries the batch consumed


@dataclass
class GroupAssembler:
    group_size: int
    groups_per_batch: int
    # (prompt id, lease id) -> [(entry id, sample)]: one lease yields one group
    partial: dict[tuple[int, str], list[tuple[bytes, Sample]]] = field(default_factory=dict)
    ready: list[tuple[Group, list[bytes]]] = field(default_factory=list)
    discard: list[bytes] = field(default_factory=list)  # entries to acknowledge and drop
    groups_assembled: int = 0
    groups_duplicate: int = 0

    def _ready_prompts(self) -> set[int]:
        return {g.prompt_id for g, _ in self.ready}

    def add(self, entry_id: bytes, sample: Sample, already_batched: Callable[[int], bool]) -> str:
        """Returns "partial", "complete" or "duplicate"."""
        key = (sample.prompt_id, sample.lease_id)
        members = self.partial.setdefault(key, [])
        members.append((entry_id, sample))
        if len(members) < self.group_size:
            return "partial"
        del self.partial[key]
        ids = [e for e, _ in members]
        if sample.prompt_id in self._ready_prompts() or already_batched(sample.prompt_id):
            self.groups_duplicate += 1
            self.discard.extend(ids)
            return "duplicate"
        # A complete group settles the prompt: other leases' partial groups are redundant.
        for other in [k for k in self.partial if k[0] == sample.prompt_id]:
            self.discard.extend(e for e, _ in self.partial.pop(other))
        self.groups_assembled += 1
        self.ready.append((Group(sample.prompt_id, [s for _, s in members]), ids))
        return "complete"

    def take_batch(self, short_ok: bool = False) -> ReadyBatch | None:
        """A full batch, or with `short_ok` whatever complete groups there are (a stopping
        run trains its last few groups rather than leave them waiting for a full batch)."""
        if not self.ready or (len(self.ready) < self.groups_per_batch and not short_ok):
            return None
        taken, self.ready = self.ready[:self.groups_per_batch], self.ready[self.groups_per_batch:]
        batch = Batch(batch_id=uuid.uuid4().hex, groups=[g for g, _ in taken])
        return ReadyBatch(batch, [e for _, ids in taken for e in ids])

    def take_discard(self) -> list[bytes]:
        out, self.discard = self.discard, []
        return out
