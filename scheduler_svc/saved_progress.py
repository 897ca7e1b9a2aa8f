"""What workers leave with the scheduler mid-lease, by prompt: a group's token state, saved
between segments (SaveProgress) or with a hand-back (Release), and on a repack's hand-back
its sequences' KV states for the next holder.

A token state is checked against its prompt and mirrored to Redis, so a scheduler restart
loses no token; at Redis's memory limit it is kept in memory and mirrored later. KV states
are kept in memory only, since losing them costs a re-prefill, not a token.
Exercised by tests/integration/test_partial_rollouts.py and test_lease_contract.py.
"""

from __future__ import annotations

import logging

import redis

from relayrl.config import SchedulerRun
from relayrl.contracts.codec import CodecError
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.partial import PartialGroup
from relayrl.runtime.backpressure import is_oom

log = logging.getLogger(__name__)


class SavedProgress:
    """The token and KV states workers left, by prompt, and the token states' Redis mirror."""

    def __init__(self, cfg: SchedulerRun, redis, keys: RunKeys):
        self.cfg = cfg
        self.redis = redis
        self.keys = keys
        self.partials: dict[int, bytes] = {
            int(k): v for k, v in (redis.hgetall(keys.partials) or {}).items()}
        self.kv_handoffs: dict[int, tuple[bytes, ...]] = {}
        self.unmirrored: set[int] = set()  # partials kept in memory only, for now
        self.oom_refusals = 0  # mirror writes Redis refused for its memory limit

    def check(self, state: bytes, prompt_id: int, where: str) -> PartialGroup:
        """The token state decoded for the prompt; ValueError naming `where` if it is too
        large or not the prompt's."""
        limit = self.cfg.scheduler.max_partial_state_bytes
        if len(state) > limit:
            raise ValueError(f"{where}.state: {len(state)} bytes, more than "
                             f"scheduler.max_partial_state_bytes ({limit})")
        try:
            return PartialGroup.decode(state, prompt_id, self.cfg.groups.group_size)
        except CodecError as err:
            raise ValueError(f"{where}.state: {err}") from None

    def keep(self, prompt_id: int, state: bytes) -> None:
        """Keep the state, mirrored to Redis for a restart. At Redis's memory limit it is kept
        here alone, and mirrored by a later refresh: the worker need not stop for it."""
        self.partials[prompt_id] = state
        try:
            self.redis.hset(self.keys.partials, str(prompt_id), state)
        except redis.ResponseError as err:
            if not is_oom(err):
                raise
            self.oom_refusals += 1
            self.unmirrored.add(prompt_id)
            return
        self.unmirrored.discard(prompt_id)

    def mirror(self) -> None:
        """Mirror to Redis the states it refused before."""
        for prompt_id in list(self.unmirrored):
            state = self.partials.get(prompt_id)
            if state is None:  # finished meanwhile
                self.unmirrored.discard(prompt_id)
            else:
                self.keep(prompt_id, state)

    def allowed_kv(self, kv_states: tuple[bytes, ...]) -> tuple[bytes, ...]:
        """The KV states, or none if together they are over the size limit."""
        kv_bytes, limit = sum(map(len, kv_states)), self.cfg.scheduler.max_partial_state_bytes
        if kv_bytes > limit:
            log.warning("Release.kv_states: %d bytes, more than scheduler."
                        "max_partial_state_bytes (%d); the taker re-prefills", kv_bytes, limit)
            return ()
        return kv_states

    def hand_over_kv(self, prompt_id: int, kv_states: tuple[bytes, ...]) -> None:
        self.kv_handoffs[prompt_id] = tuple(kv_states)

    def take_kv(self, prompt_id: int) -> tuple[bytes, ...]:
        """The KV states left for the prompt's next holder, given out once."""
        return self.kv_handoffs.pop(prompt_id, ())

    def state_of(self, prompt_id: int) -> bytes:
        return self.partials.get(prompt_id, b"")

    def forget(self, prompt_ids) -> None:
        """The prompts are settled: their states go, from Redis too."""
        ids = [i for i in prompt_ids if i in self.partials]
        if ids:
            self.redis.hdel(self.keys.partials, *map(str, ids))
            for i in ids:
                self.partials.pop(i, None)
                self.kv_handoffs.pop(i, None)
