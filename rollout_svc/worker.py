"""The rollout loop: refresh weights between segments, lease, generate, score, append.

A worker runs up to `rollout.max_active_groups` x `buffer.group_size` unfinished sequences
at once, in shared engine calls. With `rollout.segment_tokens` set, a call generates one
segment, so finished groups leave and newly leased ones join at every boundary (continuous
batching at segment granularity) and no group waits for another's longest sample. At a
boundary the scheduler may also recall a group for a repack: it is handed back, with its
token state, for a fuller worker to continue.

The worker is made of parts: rollout_svc.group_generator runs its groups in the engine (or
rollout_svc.episode_generator, as multi-turn episodes, with rollout.environment set),
rollout_svc.boundary delivers, saves and hands them over at each boundary,
rollout_svc.weight_refresh moves the engine to newer weights, rollout_svc.worker_leases makes
the lease calls safe when a reply is lost (and names the leases held in the heartbeats), and
rollout_svc.loop_clock times the loop. rollout_svc.server runs it in a worker process
(`python -m rollout_svc`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc
import redis

from relayrl.config import RolloutRun
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.leases import LeaseClient, LeasedPrompt
from relayrl.contracts.streams import TrajectoryWriter
from relayrl.rules.staleness import behind
from relayrl.runtime.backpressure import StoppedWaiting
from relayrl.runtime.outage import Outage, is_outage, ride_out
from relayrl.runtime.progress import StepWaiter
from relayrl_torch.models.loading import LoadedModel
from relayrl_torch.weights import WeightPlane
from rollout_svc.boundary import ActiveGroup, BoundarySettings, SegmentBoundary
from rollout_svc.engines.api import Engine
from rollout_svc.episode_generator import EpisodeGenerator
from rollout_svc.group_generator import GroupGenerator
from rollout_svc.loop_clock import LoopClock
from rollout_svc.weight_refresh import WeightRefresher
from rollout_svc.worker_leases import WorkerLeases

log = logging.getLogger(__name__)
SERVE_ONLY_POLL_S = 1.0
CATCH_UP_SHARE = 0.25  # of the lease TTL, the longest a worker waits for required weights


# decoded or prefilled for nothing, logged as a worker stops; bench/longtail.py reads it
WASTE_LINE = "waste: %d groups restarted stale (%d tokens), %d tokens re-prefilled after a move"


class RolloutWorker:
    """Each part keeps its own counters, read there by Status, /metrics and tests: `weights`
    (WeightRefresher: swaps, pulls, catch-up timeouts), `generator` (engine calls, resumed,
    moved and restarted groups), `boundary` (samples delivered, versions used, leases handed
    back) and `loop` (LoopClock: seconds by part). The worker counts only its failed scheduler
    calls."""

    def __init__(self, cfg: RolloutRun, engine: Engine, lm: LoadedModel,
                 scheduler: LeaseClient, relays: list[WeightPlane],
                 writer: TrajectoryWriter, reward_name: str,
                 clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self.worker_id = cfg.rollout.worker_id
        self.engine = engine
        self.lm = lm
        self.scheduler = scheduler
        self.weights = WeightRefresher(engine, relays)
        self.writer = writer
        # a worker with no room under the in-flight cap wakes at the trainer's next step
        self.steps = None if writer is None else StepWaiter(writer.r, RunKeys(cfg.run_id))
        generator = GroupGenerator if cfg.rollout.environment is None else EpisodeGenerator
        self.generator = generator(cfg, engine, lm, writer)
        self.scheduler_call_failures = 0  # calls that failed or passed their deadline
        self.leases = WorkerLeases(scheduler, self.worker_id, self._scheduler_call_failed)
        self.scheduler_outage = Outage("scheduler")  # logs a wait once; unready meanwhile
        self.loop = LoopClock()
        self.boundary = SegmentBoundary(BoundarySettings.of(cfg, reward_name), self.generator,
                                        self.leases, writer, self.loop, clock)

    @property
    def seats(self) -> int:
        """Sequences the training loop runs at once at most."""
        return self.cfg.rollout.max_active_groups * self.cfg.groups.group_size

    def refresh_weights(self, holding: bool = False) -> bool:
        """Move to the newest version a relay offers (WeightRefresher.refresh). A worker
        `holding` unfinished groups under rollout.reload when_behind stays on its weights
        while it may still start prompts on them (relayrl.rules.staleness.behind, the rule the
        simulator's preempting workers follow); the relay's newest version stands for the
        trainer's."""
        if not holding or self.cfg.rollout.reload == "every_segment":
            return self.weights.refresh()
        return self.weights.refresh(stay=lambda newest: not behind(
            self.engine.version, newest, self.generator.max_staleness,
            self.cfg.lease.max_start_lag))

    def register(self) -> None:
        self.leases.register(self.cfg.rollout.endpoint.address)

    def _scheduler_call_failed(self) -> None:
        self.scheduler_call_failures += 1

    def heartbeat_loop(self, stop: threading.Event) -> None:
        interval = self.cfg.lease.heartbeat_interval_s
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
        return self.boundary.activate(lease)

    def advance(self, active: list[ActiveGroup], stop: threading.Event | None = None
                ) -> tuple[list[ActiveGroup], int]:
        """One segment for every active group (SegmentBoundary.advance): returns (the groups
        still held, how many were delivered)."""
        return self.boundary.advance(active, stop)

    def release_all(self, active: list[ActiveGroup]) -> None:
        """Hand unfinished groups back with their token state, for another worker."""
        self.boundary.release_all(active)

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
                self.refresh_weights(holding=True)
        return delivered == 1

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
            with self.loop.timed("weights"):
                self.refresh_weights(holding=bool(active))
            with self.loop.timed("lease"):
                self.leases.confirm_deliveries()
                wait_s, capped = self._refill(active, stop)
            self._report_loop()
            if not active:
                with self.loop.timed("idle"):
                    if capped and self.steps is not None:
                        self.steps.wait(wait_s, stop)
                    else:
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
                self.boundary.hand_back_abandoned(active)
                active = []
                stop.wait(1.0)
        self._report_loop(every_s=0.0)
        gen = self.generator
        log.info(WASTE_LINE, gen.groups_restarted_stale, gen.tokens_restarted_stale,
                 gen.tokens_reprefilled)
        self.leases.confirm_deliveries()
        self.release_all(active)

    def _report_loop(self, every_s: float = 60.0) -> None:
        self.loop.report(self.generator.segments, self.generator.sequences_decoded, self.seats,
                         every_s)

    def _catch_up(self, min_version: int, stop: threading.Event) -> None:
        """Before starting new prompts, move to at least `min_version` if a relay can serve
        it soon: a prompt started on older weights has too few trainer steps left to finish in
        before its tokens are dropped as stale (scheduler.max_start_lag). Gives up after a
        fraction of the lease TTL rather than let the leases lapse."""
        self.weights.catch_up(min_version, stop,
                              CATCH_UP_SHARE * self.cfg.lease.lease_ttl_s)

    def _refill(self, active: list[ActiveGroup], stop: threading.Event) -> tuple[float, bool]:
        """Lease about as many prompts as there are free seats for (capacity:
        rollout.max_active_groups groups' worth of sequences); new groups join at the next
        segment. Returns how long to wait if there is nothing to generate, and whether the
        scheduler asked to retry (no prompt free now: a trainer step may free one)."""
        n = self.cfg.groups.group_size
        free = self.seats - sum(
            len(a.group.unfinished()) for a in active)
        if free <= 0:
            return 0.0, False
        # a seat short of a whole group still asks for one: a repacked tail reserved for this
        # worker may need only that seat (a fresh group may then overfill by < n sequences)
        want = max(1, free // n)
        try:
            resp = self.leases.acquire(want)
        except grpc.RpcError as err:
            self.scheduler_call_failures += 1
            if is_outage(err):  # the wait is logged once, and drawn with backoff
                return self.scheduler_outage.failed(err), False
            log.warning("scheduler unavailable (%s); retrying", err.code())
            return 1.0, False
        self.scheduler_outage.recovered()
        if resp.done and not active:
            log.info("scheduler has no more prompts; idling")
            return 1.0, False
        if resp.leases:
            self._catch_up(resp.min_version, stop)
        for lease in resp.leases:
            if stop.is_set():  # not started: hand it back for re-issue now
                self.boundary.release(lease.lease_id)
                continue
            active.append(self.activate(lease))
        if resp.leases:
            return 0.0, False
        return resp.retry_after_s or 0.05, True
