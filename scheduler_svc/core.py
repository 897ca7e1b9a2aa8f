"""The scheduler in process: LeasePolicy behind a lock, the task's prompts, a Redis ledger.

The gRPC servicer is a thin translation of this class, which is also the in-process
implementation of the lease contract. What a worker leaves mid-lease (token and KV states)
is kept by a SavedProgress (scheduler_svc.saved_progress).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Collection
from pathlib import Path

import redis

from relayrl.config import PretrainedModel, SchedulerRun
from relayrl.contracts import control, ledger
from relayrl.contracts.control import LiveSettings, RunState, SettingsChange
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.leases import LeaseBatch, LeaseClient, LeasedPrompt, ProgressReply
from relayrl.rules.repack import Move
from relayrl.rules.staleness import inflight_prompts, oldest_startable
from relayrl.runtime.backpressure import is_oom
from relayrl_tasks.tasks import load_run_task
from scheduler_svc.idempotency import check_id
from scheduler_svc.policy import LeasePolicy
from scheduler_svc.saved_progress import SavedProgress

log = logging.getLogger(__name__)
MAX_HELD_LEASES = 65_536  # lease ids one heartbeat may name
REFRESH_S = 0.2  # between refresh() calls: lapsed leases, the trainer's progress, repacks


def unheld_grace_s(cfg: SchedulerRun) -> float:
    """How long a lease absent from its worker's heartbeats may be a grant still on its way:
    a heartbeat the scheduler acts on was sent at most one call deadline before (a later
    one is ignored), by a worker that had the grant's reply at most one deadline after the
    grant. A heartbeat interval on top covers the worker's own delay."""
    s = cfg.scheduler
    return 2 * s.call_timeout_s + s.heartbeat_interval_s


def converted_model(model_cfg: PretrainedModel) -> Path:
    """The pretrained model's converted directory, whose tokenizer counts the task's prompts;
    converted first when it is not there yet."""
    # imported here: of the model kinds, only a pretrained one needs the model side here
    from relayrl_torch.models.cache import pretrained_dir

    return pretrained_dir(model_cfg)


class SchedulerCore(LeaseClient):
    def __init__(self, cfg: SchedulerRun, redis, clock=time.monotonic):
        self.cfg = cfg
        self.policy = LeasePolicy(lease_ttl_s=cfg.scheduler.lease_ttl_s,
                                  max_attempts=cfg.scheduler.max_attempts,
                                  max_inflight=cfg.inflight_limit,
                                  max_prompts=cfg.scheduler.max_prompts,
                                  start_after_workers=cfg.scheduler.start_after_workers,
                                  group_size=cfg.groups.group_size,
                                  worker_capacity=cfg.repack_capacity,
                                  repack_below=cfg.scheduler.repack_below,
                                  reservation_s=cfg.scheduler.repack_reservation_s,
                                  unheld_grace_s=unheld_grace_s(cfg))
        self.last_repack = 0.0
        self.trainer_version = 0  # as of the last refresh
        self.progress_unread = False  # the last read of the trainer's progress failed
        self.redis = redis
        self.keys = RunKeys(cfg.run_id)
        self.task = load_run_task(cfg, converted_model)
        self.clock = clock
        self.lock = threading.Lock()
        self.saved = SavedProgress(cfg, redis, self.keys)
        # ledger entries Redis refused for its memory limit, written again by refresh()
        self.unrecorded: dict[str, set[int]] = {}
        self.ledger_lock = threading.Lock()
        self.ledger_oom_refusals = 0
        # an operator's pause or stop and changed settings outlive a scheduler restart
        self.policy.control.state = control.read_run_state(redis, self.keys)
        self.settings = control.read_settings(redis, self.keys, cfg.live)
        self._apply(self.settings)
        self._take_up_ledger()

    @property
    def redis_oom_refusals(self) -> int:
        """Writes Redis refused for its memory limit, to the ledger and of saved states."""
        return self.ledger_oom_refusals + self.saved.oom_refusals

    def _take_up_ledger(self) -> None:
        """After a restart: go on from the prompts the ledger says were handed out, with
        lease ids no earlier process used (a worker may still hold one of its leases)."""
        self.policy.lease_prefix = f"L{uuid.uuid4().hex[:8]}-"

        def read(name: str) -> set[int]:
            return ledger.members(self.redis, self.keys, name)

        self.policy.restore(read("leased"), read("batched"), read("failed"))
        if self.policy.cursor:
            log.info("taking up after %d prompts handed out: %d to lease again",
                     self.policy.cursor, len(self.policy.requeue))

    def _apply(self, settings: LiveSettings) -> None:
        if not self.cfg.scheduler.max_inflight_prompts:  # derived from the staleness bound
            self.policy.max_inflight = inflight_prompts(self.cfg.groups.groups_per_batch,
                                                        settings.max_staleness)

    def change_settings(self, change: SettingsChange) -> LiveSettings:
        with self.lock:
            settings = change.applied_to(self.settings)
            control.write_settings(self.redis, self.keys, settings)
            self.settings = settings
            self._apply(settings)
        log.info("live settings now %s", settings.model_dump())
        return settings

    def set_run_state(self, action: str) -> RunState:
        """pause, resume or stop; TransitionError when the state does not allow it."""
        with self.lock:
            getattr(self.policy.control, action)()
            state = self.policy.control.state
            control.write_run_state(self.redis, self.keys, state)
        log.info("run %s: %s", action, state.value)
        return state

    def _record(self, name: str, prompt_ids) -> None:
        """Add prompt ids to a ledger. A write Redis refuses at its memory limit is kept
        and tried again on every refresh, so the books stay whole and no caller waits."""
        with self.ledger_lock:
            todo = self.unrecorded.setdefault(name, set())
            todo.update(prompt_ids)
            if not todo:
                return
            try:
                ledger.add(self.redis, self.keys, name, sorted(todo))
            except redis.ResponseError as err:
                if not is_oom(err):
                    raise
                if not self.redis_oom_refusals:
                    log.warning("Redis is at its memory limit; %d %s prompts kept to record "
                                "later", len(todo), name)
                self.ledger_oom_refusals += 1
                return
            todo.clear()

    def refresh(self) -> None:
        """Expire lapsed leases and learn how many of its prompts the trainer has stepped past
        (trained or dropped as stale)."""
        for name in list(self.unrecorded):
            self._record(name, ())
        with self.lock:
            self.saved.mirror()
        try:
            self._read_trainer_progress()
        except redis.RedisError:
            self.progress_unread = True
            raise
        with self.lock:
            failed_before = set(self.policy.failed)
            lapsed = self.policy.expire(self.clock())
            newly_failed = self.policy.failed - failed_before
            drained = self.policy.control.stopping and self.policy.done
            target = self.policy.handed_out - len(self.policy.failed)
        for lease in lapsed:
            log.warning("lease %s of prompt %d on %s expired (attempt %d)", lease.lease_id,
                        lease.prompt_id, lease.worker_id, lease.attempt)
        if newly_failed:
            self._record("failed", newly_failed)
            self.saved.forget(newly_failed)
        if drained:  # nothing is out any more: the trainer may end once it has all of it
            self.redis.set(self.keys.stop_target, target)
        interval = self.cfg.scheduler.repack_interval_s
        if interval and self.clock() - self.last_repack >= interval:
            self.repack()

    def _read_trainer_progress(self) -> None:
        """How many of its prompts the trainer has stepped past, and its version."""
        finished, version = self.redis.mget(self.keys.prompts_finished,
                                            self.keys.trainer_version)
        self.progress_unread = False
        self.trainer_version = int(version or 0)
        with self.lock:
            self.policy.set_finished(int(finished or 0))

    def _catch_up_with_trainer(self) -> None:
        """Before a lease call the in-flight cap would refuse: the trainer may have stepped
        past prompts since the last refresh (up to REFRESH_S ago). Reading its progress now
        frees the cap the moment a step ends, not a refresh later: on a fast trainer that
        wait was most of a step with the workers idle. While Redis is failing (the last read
        failed, here or in refresh) the last figures stand, and refresh() rides it out."""
        with self.lock:
            capped = self.policy.inflight >= self.policy.max_inflight
        if not capped or self.progress_unread:
            return
        try:
            self._read_trainer_progress()
        except redis.RedisError as err:
            self.progress_unread = True
            log.debug("trainer progress not read on a lease call: %s", err)

    def repack(self, force: bool = False) -> list[Move]:
        """Recall tail workers' leases for fuller workers (relayrl.rules.repack's rule); the holders
        hand them back at their next segment boundary."""
        with self.lock:
            self.last_repack = self.clock()
            moves = self.policy.plan_repack(self.last_repack, force)
        for m in moves:
            log.info("repack: lease %s (%d sequences) from %s to %s", m.item, m.size,
                     m.source, m.target)
        return moves

    def register(self, worker_id: str, address: str, incarnation: str = "") -> None:
        if not worker_id:
            raise ValueError("Register: worker_id is empty")
        check_id(incarnation, "Register.incarnation")
        with self.lock:
            self.policy.register(worker_id, self.clock(), incarnation)
            waiting = (not self.policy.started
                       and len(self.policy.workers) < self.policy.start_after_workers)
            have, need = len(self.policy.workers), self.policy.start_after_workers
        log.info("worker %s registered (%s)", worker_id, address)
        if waiting:  # else a run short of workers looks hung
            log.info("no lease until %d workers have registered, %d so far "
                     "(scheduler.start_after_workers)", need, have)

    def acquire(self, worker_id: str, max_prompts: int, request_id: str = "") -> LeaseBatch:
        if not worker_id:
            raise ValueError("AcquireLeases: worker_id is empty")
        if not 1 <= max_prompts <= 1024:
            raise ValueError(f"AcquireLeases: max_prompts must be in 1..1024, got {max_prompts}")
        check_id(request_id, "AcquireLeases.request_id")
        self._catch_up_with_trainer()
        with self.lock:
            first_new = self.policy.cursor
            grants = self.policy.acquire(worker_id, max_prompts, self.clock(), request_id)
            new_ids = list(range(first_new, self.policy.cursor))
            done = self.policy.done
            # whole batches out before the last prompt granted: trained that much later
            ahead = max(0, self.policy.inflight - 1) // self.cfg.groups.groups_per_batch
        if new_ids:
            self._record("leased", new_ids)
        leases = []
        for g in grants:
            p = self.task.problem(g.prompt_id)
            leases.append(LeasedPrompt(g.lease_id, p.prompt_id, p.text, p.reference, g.attempt,
                                       self.saved.state_of(g.prompt_id),
                                       self.saved.take_kv(g.prompt_id),
                                       p.messages, p.metadata))
        floor = oldest_startable(self.trainer_version, self.settings.max_staleness,
                                 self.cfg.scheduler.max_start_lag, ahead)
        return LeaseBatch(leases, done, 0.0 if leases else 0.05, floor)

    def heartbeat(self, worker_id: str, policy_version: int,
                  held: Collection[str] | None = None, fresh: bool = True) -> bool:
        """`held`: the leases the worker holds, if it says; only those are renewed. Its
        other leases are re-issued unless `fresh` is False (a heartbeat that arrived past its
        deadline, whose list may predate a grant the worker has since received)."""
        if held is not None:
            if len(held) > MAX_HELD_LEASES:
                raise ValueError(f"Heartbeat.held.lease_ids: {len(held)} ids, more than "
                                 f"{MAX_HELD_LEASES}")
            held = {check_id(i, "Heartbeat.held.lease_ids[]") for i in held}
        with self.lock:
            now = self.clock()
            known = self.policy.heartbeat(worker_id, policy_version, now, held)
            unheld = self.policy.release_unheld(worker_id, held, now) if (
                known and fresh and held is not None) else []
        for lease in unheld:
            log.warning("lease %s of prompt %d is not among the leases %s holds: its grant "
                        "never reached it; re-issued", lease.lease_id, lease.prompt_id,
                        worker_id)
        return known

    def _prompt_of(self, worker_id: str, lease_id: str) -> int | None:
        with self.lock:
            return self.policy.holder_prompt(lease_id, worker_id)

    def save_progress(self, worker_id: str, lease_id: str, state: bytes) -> ProgressReply:
        prompt_id = self._prompt_of(worker_id, lease_id)
        if prompt_id is None:
            return ProgressReply(False)
        group = self.saved.check(state, prompt_id, "SaveProgress")
        with self.lock:  # the lease may have lapsed while the state was checked
            recalled = self.policy.note_progress(lease_id, worker_id, len(group.unfinished()))
            if recalled is None:
                return ProgressReply(False)
            self.saved.keep(prompt_id, state)
        return ProgressReply(True, recalled)

    def complete(self, worker_id: str, lease_id: str) -> bool:
        with self.lock:
            prompt_id = self.policy.holder_prompt(lease_id, worker_id)
            if prompt_id is None:  # a late delivery of a lapsed lease may still count
                prompt_id = self.policy.expired.get(lease_id)
            accepted = self.policy.complete(lease_id, worker_id)
        if accepted and prompt_id is not None:
            self.saved.forget([prompt_id])
        return accepted

    def release(self, worker_id: str, lease_id: str, state: bytes = b"",
                kv_states: tuple[bytes, ...] = ()) -> bool:
        with self.lock:  # a retry's state is older than what a new holder may have saved
            if self.policy.released_before(lease_id, worker_id):
                return True
        prompt_id = self._prompt_of(worker_id, lease_id)
        if prompt_id is None:
            return False
        if state:
            self.saved.check(state, prompt_id, "Release")
        kv_states = self.saved.allowed_kv(kv_states)
        with self.lock:
            if self.policy.holder_prompt(lease_id, worker_id) is None:
                return False
            if state:  # kept before the prompt can be leased again
                self.saved.keep(prompt_id, state)
            if kv_states:
                self.saved.hand_over_kv(prompt_id, kv_states)
            self.policy.release(lease_id, worker_id, self.clock())
        log.info("worker %s handed back prompt %d%s", worker_id, prompt_id,
                 " with its token state" if state else "")
        return True
