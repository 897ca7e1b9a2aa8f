"""The rollout loop: refresh weights between segments, lease, generate, score, append.

A worker runs up to `rollout.max_active_groups` x `samples_per_prompt` unfinished sequences
at once, in shared engine calls. With `rollout.segment_tokens` set, a call generates one
segment, so finished groups leave and newly leased ones join at every boundary (continuous
batching at segment granularity) and no group waits for another's longest sample. At a
boundary the scheduler may also recall a group for a repack: it is handed back, with its
token state, for a fuller worker to continue.

The lease calls go through rollout_svc.worker_leases, which makes them safe when a reply is
lost and names the leases held in the heartbeats."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
import redis

from relayrl.backpressure import StoppedWaiting
from relayrl.config import RunConfig
from relayrl.leases import LeaseClient, LeasedPrompt
from relayrl.messages import Group, Sample, validate_sample
from relayrl.models.loading import LoadedModel
from relayrl.outage import Outage, is_outage, ride_out
from relayrl.partial import PartialGroup
from relayrl.repack import is_tail
from relayrl.rewards import get_reward, score
from relayrl.streams import TrajectoryWriter
from relayrl.weights import WeightPlane
from rollout_svc.engine_api import Engine
from rollout_svc.group_generator import GroupGenerator
from rollout_svc.weight_refresh import WeightRefresher
from rollout_svc.worker_leases import WorkerLeases

log = logging.getLogger(__name__)
SERVE_ONLY_POLL_S = 1.0
CATCH_UP_SHARE = 0.25  # of the lease TTL, the longest a worker waits for required weights


@dataclass
class ActiveGroup:
    lease: LeasedPrompt
    group: PartialGroup
    saved_at: float  # when its token state was last saved (or it started)


def _counter(part: str, name: str) -> property:
    return property(lambda self: getattr(getattr(self, part), name))


class RolloutWorker:
    # counters kept by the worker's parts, read by Status, /metrics and tests
    weight_swaps = _counter("weights", "weight_swaps")
    pull_failures = _counter("weights", "pull_failures")
    bytes_pulled = _counter("weights", "bytes_pulled")
    last_pull_s = _counter("weights", "last_pull_s")
    catch_up_timeouts = _counter("weights", "catch_up_timeouts")
    segments = _counter("generator", "segments")
    sequences_decoded = _counter("generator", "sequences_decoded")
    mid_sequence_swaps = _counter("generator", "mid_sequence_swaps")
    groups_resumed = _counter("generator", "groups_resumed")
    groups_restarted_stale = _counter("generator", "groups_restarted_stale")
    kv_imported = _counter("generator", "kv_imported")
    kv_refused = _counter("generator", "kv_refused")

    def __init__(self, cfg: RunConfig, engine: Engine, lm: LoadedModel,
                 scheduler: LeaseClient, relays: list[WeightPlane],
                 writer: TrajectoryWriter, reward_name: str,
                 clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self.clock = clock
        self.worker_id = cfg.rollout.worker_id
        self.engine = engine
        self.lm = lm
        self.scheduler = scheduler
        self.weights = WeightRefresher(engine, relays)
        self.writer = writer
        self.generator = GroupGenerator(cfg, engine, lm, writer)
        self.reward_fn = get_reward(reward_name)
        self.samples_generated = 0
        self.versions_used: set[int] = set()
        self.leases_released = 0
        self.groups_moved_out = 0  # handed over to another worker by a repack
        self.scheduler_call_failures = 0  # calls that failed or passed their deadline
        self.leases = WorkerLeases(scheduler, self.worker_id, self._scheduler_call_failed)
        self.scheduler_outage = Outage("scheduler")  # logs a wait once; unready meanwhile
        # where the training loop's time goes: generate, weights, lease, deliver, save, idle
        self.loop_s: Counter[str] = Counter()
        self._last_report = time.monotonic()

    @contextmanager
    def _timed(self, part: str):
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.loop_s[part] += time.monotonic() - t0

    @property
    def seats(self) -> int:
        """Sequences the training loop runs at once at most."""
        return self.cfg.rollout.max_active_groups * self.cfg.rollout.samples_per_prompt

    def refresh_weights(self) -> bool:
        """Move to the newest version a relay offers (WeightRefresher.refresh)."""
        return self.weights.refresh()

    def register(self) -> None:
        self.leases.register(self.cfg.rollout.endpoint.address)

    def _scheduler_call_failed(self) -> None:
        self.scheduler_call_failures += 1

    def heartbeat_loop(self, stop: threading.Event) -> None:
        interval = self.cfg.scheduler.heartbeat_interval_s
        while not stop.wait(interval):
            try:
                if not self.leases.heartbeat(self.engine.version):
                    self.register()
            except grpc.RpcError as err:
                self.scheduler_call_failures += 1
                if is_outage(err):
                    self.scheduler_outage.failed(err)
                else:
                    log.warning("heartbeat failed: %s", err.code())
                continue
            self.scheduler_outage.recovered()

    def activate(self, lease: LeasedPrompt) -> ActiveGroup:
        return ActiveGroup(lease, self.generator.start(lease), self.clock())

    def advance(self, active: list[ActiveGroup], stop: threading.Event | None = None
                ) -> tuple[list[ActiveGroup], int]:
        """One segment for every active group: finished groups are scored and delivered (a
        delivery waits while the buffer is full), the others' token state is saved with the
        scheduler when rollout.save_every_s has passed since their last save, or at once on
        a worker left with a tail (a save's reply may recall the group for a repack).
        Returns (the groups still held, how many were delivered)."""
        with self._timed("generate"):
            self.generator.generate_segment([a.group for a in active])
        going = [a for a in active if not a.group.finished]
        delivered = 0
        for a in active:
            if a.group.finished:
                with self._timed("deliver"):
                    self.deliver(a.lease, a.group, stop)
                delivered += 1
        now = self.clock()
        due = self._due_for_saving(going, now)
        if not due:
            return going, delivered
        with self._timed("save"):
            try:
                replies = self.scheduler.save_progress_many(
                    self.worker_id, [(a.lease.lease_id, a.group.encode()) for a in due])
            except grpc.RpcError as err:  # saved or not, the next boundary saves again
                self.scheduler_call_failures += 1
                log.warning("saving %d groups' progress failed (%s)", len(due), err.code())
                return going, delivered
        let_go = set()
        for a, reply in zip(due, replies, strict=True):
            a.saved_at = now
            if not reply.accepted:
                log.warning("lease %s lapsed mid-generation; dropping it", a.lease.lease_id)
                let_go.add(a.lease.lease_id)
                self.leases.let_go([a.lease.lease_id])
            elif reply.release and self.hand_over(a):
                let_go.add(a.lease.lease_id)
        return [a for a in going if a.lease.lease_id not in let_go], delivered

    def _due_for_saving(self, going: list[ActiveGroup], now: float) -> list[ActiveGroup]:
        """The groups whose token state to save now: those unsaved for save_every_s, or all
        of them on a worker left with a tail when repacking is on (the scheduler's own rule,
        relayrl.repack.is_tail): the planner learns a group's progress, and recalls it, only
        through saves."""
        if not self.cfg.rollout.segment_tokens:
            return []
        capacity = self.cfg.repack_capacity  # 0 with repacking off
        load = sum(len(a.group.unfinished()) for a in going)
        if capacity and is_tail(load, capacity, self.cfg.scheduler.repack_below):
            return going
        return [a for a in going if now - a.saved_at >= self.cfg.rollout.save_every_s]

    def hand_over(self, a: ActiveGroup) -> bool:
        """A repack recalled the group: hand it back (its token state was just saved) for
        the worker the scheduler chose. If the scheduler refuses, keep generating it."""
        kv = [self.engine.export_state(a.group.prompt_tokens + s.tokens)
              for s in a.group.unfinished()]
        kv_states = tuple(state.encode() for state in kv if state is not None)
        if not self.leases.hand_over(a.lease.lease_id, kv_states):
            return False
        self.leases_released += 1
        self.groups_moved_out += 1
        return True

    def release_all(self, active: list[ActiveGroup]) -> None:
        """Hand unfinished groups back with their token state, for another worker."""
        for a in active:
            self._release(a.lease.lease_id, a.group.encode())

    def _release(self, lease_id: str, state: bytes = b"") -> bool:
        released = self.leases.hand_back(lease_id, state)
        self.leases_released += released
        return released

    def run_lease(self, lease: LeasedPrompt, stop: threading.Event | None = None) -> bool:
        """Generate, score and deliver one prompt's group, segment by segment, moving to newer
        weights and saving the token state at each boundary. Returns False if it stopped
        first, having handed the lease back with the state so far."""
        active, delivered = [self.activate(lease)], 0
        while active:
            active, delivered = self.advance(active, stop)
            if active and stop is not None and stop.is_set():
                self.release_all(active)
                return False
            if active:
                self.refresh_weights()
        return delivered == 1

    def deliver(self, lease: LeasedPrompt, group: PartialGroup,
                stop: threading.Event | None = None) -> None:
        samples = []
        for seq in group.sequences:
            reward, error = score(self.reward_fn, self.lm.decode(seq.tokens), lease.reference,
                                  self.cfg.buffer.reward_range)
            samples.append(Sample(
                prompt_id=lease.prompt_id, lease_id=lease.lease_id, worker_id=self.worker_id,
                prompt_tokens=group.prompt_tokens, response_tokens=seq.tokens,
                logprobs=seq.logprobs, versions=seq.versions, reward=reward,
                finish_reason=seq.finish_reason, reward_error=error))
            validate_sample(samples[-1])  # where a rollout enters the run: checked once, here
            self.versions_used.update(seq.versions)
        # waits for room: this worker takes no new prompt
        self.writer.append(Group(lease.prompt_id, samples), stop)
        self.samples_generated += len(samples)
        self.leases.delivered(lease.lease_id)

    def run(self, stop: threading.Event) -> None:
        if not self.cfg.rollout.train_loop:  # custom rollouts only: just follow the weights
            while not stop.is_set():
                self.refresh_weights()
                stop.wait(SERVE_ONLY_POLL_S)
            return
        try:
            ride_out("scheduler", self.register, stop)  # registering again changes nothing
        except StoppedWaiting:
            return
        beats = threading.Thread(target=self.heartbeat_loop, args=(stop,), daemon=True)
        beats.start()
        active: list[ActiveGroup] = []
        while not stop.is_set():
            with self._timed("weights"):
                self.refresh_weights()
            with self._timed("lease"):
                self.leases.confirm_deliveries()
                wait_s = self._refill(active, stop)
            self._report_loop()
            if not active:
                with self._timed("idle"):
                    stop.wait(wait_s)
                continue
            try:
                active, _ = self.advance(active, stop)
            except StoppedWaiting:  # not delivered: its leases lapse (at once if it restarts)
                log.info("stopped while waiting to deliver; %d leases lapse", len(active))
                return
            except (grpc.RpcError, redis.RedisError) as err:
                if isinstance(err, grpc.RpcError):
                    self.scheduler_call_failures += 1
                # handed back (or, with the scheduler unreachable, left to lapse) and
                # re-issued; anything already appended is de-duplicated by the buffer
                log.warning("%d leases abandoned: %s", len(active), err)
                self._hand_back_abandoned(active)
                active = []
                stop.wait(1.0)
        self._report_loop(every_s=0.0)
        self.leases.confirm_deliveries()
        self.release_all(active)

    def _report_loop(self, every_s: float = 60.0) -> None:
        """A log line now and then: where the loop's time went and how full its engine calls
        were (sequences per call against the seats), the first thing to read when a worker
        generates slower than expected."""
        now = time.monotonic()
        if now - self._last_report < every_s:
            return
        self._last_report = now
        total = sum(self.loop_s.values()) or 1.0
        shares = ", ".join(f"{part} {s / total:.0%}" for part, s in self.loop_s.most_common())
        fill = self.sequences_decoded / self.segments if self.segments else 0.0
        log.info("loop: %s; %d engine calls, %.1f of %d seats each", shares, self.segments,
                 fill, self.seats)

    def _hand_back_abandoned(self, active: list[ActiveGroup]) -> None:
        """Release abandoned leases without state, for another worker to take now. Once a
        call fails the rest are only let go: the scheduler re-issues them when this worker's
        heartbeats no longer name them."""
        for i, a in enumerate(active):
            if not self._release(a.lease.lease_id):
                self.leases.let_go(rest.lease.lease_id for rest in active[i + 1:])
                return

    def _catch_up(self, min_version: int, stop: threading.Event) -> None:
        """Before starting new prompts, move to at least `min_version` if a relay can serve
        it soon: tokens of older weights would be dropped as stale. Gives up after a fraction
        of the lease TTL rather than let the leases lapse."""
        self.weights.catch_up(min_version, stop,
                              CATCH_UP_SHARE * self.cfg.scheduler.lease_ttl_s)

    def _refill(self, active: list[ActiveGroup], stop: threading.Event) -> float:
        """Lease about as many prompts as there are free seats for (capacity:
        rollout.max_active_groups groups' worth of sequences); new groups join at the next
        segment. Returns how long to wait if there is nothing to generate."""
        n = self.cfg.rollout.samples_per_prompt
        free = self.seats - sum(
            len(a.group.unfinished()) for a in active)
        if free <= 0:
            return 0.0
        # a seat short of a whole group still asks for one: a repacked tail reserved for this
        # worker may need only that seat (a fresh group may then overfill by < n sequences)
        want = max(1, free // n)
        try:
            resp = self.leases.acquire(want)
        except grpc.RpcError as err:
            self.scheduler_call_failures += 1
            if is_outage(err):  # the wait is logged once, and drawn with backoff
                return self.scheduler_outage.failed(err)
            log.warning("scheduler unavailable (%s); retrying", err.code())
            return 1.0
        self.scheduler_outage.recovered()
        if resp.done and not active:
            log.info("scheduler has no more prompts; idling")
            return 1.0
        if resp.leases:
            self._catch_up(resp.min_version, stop)
        for lease in resp.leases:
            if stop.is_set():  # not started: hand it back for re-issue now
                self._release(lease.lease_id)
                continue
            active.append(self.activate(lease))
        return resp.retry_after_s or 0.05
