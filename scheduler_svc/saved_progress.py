"""What a worker leaves with the scheduler mid-lease (SchedulerCore mixes it in): a
group's token state, saved between segments (SaveProgress) or with a hand-back (Release),
and on a repack's hand-back its sequences' KV states for the next holder.

A token state is checked against the lease's prompt and mirrored to Redis, so a scheduler
restart loses no token; at Redis's memory limit it is kept in memory and mirrored later.
Exercised by tests/integration/test_partial_rollouts.py and test_lease_contract.py.
"""

from __future__ import annotations

import logging

import redis

from relayrl.contracts.codec import CodecError
from relayrl.contracts.leases import ProgressReply
from relayrl.contracts.partial import PartialGroup
from relayrl.runtime.backpressure import is_oom

log = logging.getLogger(__name__)


class SavedProgress:
    """Methods only: the state (partials, kv_handoffs, unmirrored, policy, lock, ...) is
    SchedulerCore's."""

    def _check_state(self, state: bytes, prompt_id: int, where: str) -> PartialGroup:
        limit = self.cfg.scheduler.max_partial_state_bytes
        if len(state) > limit:
            raise ValueError(f"{where}.state: {len(state)} bytes, more than "
                             f"scheduler.max_partial_state_bytes ({limit})")
        try:
            return PartialGroup.decode(state, prompt_id, self.cfg.rollout.samples_per_prompt)
        except CodecError as err:
            raise ValueError(f"{where}.state: {err}") from None

    def _keep_partial(self, prompt_id: int, state: bytes) -> None:
        """Keep the state, mirrored to Redis for a restart. At Redis's memory limit it is kept
        here alone, and mirrored by a later refresh: the worker need not stop for it."""
        self.partials[prompt_id] = state
        try:
            self.redis.hset(self.keys.partials, str(prompt_id), state)
        except redis.ResponseError as err:
            if not is_oom(err):
                raise
            self.redis_oom_refusals += 1
            self.unmirrored.add(prompt_id)
            return
        self.unmirrored.discard(prompt_id)

    def _mirror_partials(self) -> None:
        for prompt_id in list(self.unmirrored):
            state = self.partials.get(prompt_id)
            if state is None:  # finished meanwhile
                self.unmirrored.discard(prompt_id)
            else:
                self._keep_partial(prompt_id, state)

    def _forget_partials(self, prompt_ids) -> None:
        ids = [i for i in prompt_ids if i in self.partials]
        if ids:
            self.redis.hdel(self.keys.partials, *map(str, ids))
            for i in ids:
                self.partials.pop(i, None)
                self.kv_handoffs.pop(i, None)

    def _prompt_of(self, worker_id: str, lease_id: str) -> int | None:
        with self.lock:
            return self.policy.holder_prompt(lease_id, worker_id)

    def save_progress(self, worker_id: str, lease_id: str, state: bytes) -> ProgressReply:
        prompt_id = self._prompt_of(worker_id, lease_id)
        if prompt_id is None:
            return ProgressReply(False)
        group = self._check_state(state, prompt_id, "SaveProgress")
        with self.lock:  # the lease may have lapsed while the state was checked
            recalled = self.policy.note_progress(lease_id, worker_id, len(group.unfinished()))
            if recalled is None:
                return ProgressReply(False)
            self._keep_partial(prompt_id, state)
        return ProgressReply(True, recalled)

    def release(self, worker_id: str, lease_id: str, state: bytes = b"",
                kv_states: tuple[bytes, ...] = ()) -> bool:
        with self.lock:  # a retry's state is older than what a new holder may have saved
            if self.policy.released_before(lease_id, worker_id):
                return True
        prompt_id = self._prompt_of(worker_id, lease_id)
        if prompt_id is None:
            return False
        if state:
            self._check_state(state, prompt_id, "Release")
        kv_bytes, limit = sum(map(len, kv_states)), self.cfg.scheduler.max_partial_state_bytes
        if kv_bytes > limit:
            log.warning("Release.kv_states: %d bytes, more than scheduler."
                        "max_partial_state_bytes (%d); the taker re-prefills", kv_bytes, limit)
            kv_states = ()
        with self.lock:
            if self.policy.holder_prompt(lease_id, worker_id) is None:
                return False
            if state:  # kept before the prompt can be leased again
                self._keep_partial(prompt_id, state)
            if kv_states:
                self.kv_handoffs[prompt_id] = tuple(kv_states)
            self.policy.release(lease_id, worker_id, self.clock())
        log.info("worker %s handed back prompt %d%s", worker_id, prompt_id,
                 " with its token state" if state else "")
        return True
