"""Batch packing, with no I/O: fed trajectory entries (one whole group each), it says what
to emit and which entries may be acknowledged."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from relayrl.contracts.messages import Batch, Group


@dataclass
class ReadyBatch:
    batch: Batch
    entry_ids: list[bytes]  # trajectory entries the batch consumed


@dataclass
class GroupAssembler:
    groups_per_batch: int
    ready: list[tuple[Group, bytes]] = field(default_factory=list)
    discard: list[bytes] = field(default_factory=list)  # entries to acknowledge and drop
    groups_assembled: int = 0
    groups_duplicate: int = 0

    def add(self, entry_id: bytes, group: Group, already_batched: Callable[[int], bool]) -> str:
        """Returns "ready", or "duplicate" for a second group of a prompt (an append
        repeated after a lost reply, or a lease re-issued after its group went in): the
        first group settles the prompt."""
        if (any(g.prompt_id == group.prompt_id for g, _ in self.ready)
                or already_batched(group.prompt_id)):
            self.groups_duplicate += 1
            self.discard.append(entry_id)
            return "duplicate"
        self.groups_assembled += 1
        self.ready.append((group, entry_id))
        return "ready"

    def take_batch(self, short_ok: bool = False) -> ReadyBatch | None:
        """A full batch, or with `short_ok` whatever groups there are (a stopping run trains
        its last few groups rather than leave them waiting for a full batch)."""
        if not self.ready or (len(self.ready) < self.groups_per_batch and not short_ok):
            return None
        taken, self.ready = self.ready[:self.groups_per_batch], self.ready[self.groups_per_batch:]
        batch = Batch(batch_id=uuid.uuid4().hex, groups=[g for g, _ in taken])
        return ReadyBatch(batch, [e for _, e in taken])

    def take_discard(self) -> list[bytes]:
        out, self.discard = self.discard, []
        return out
