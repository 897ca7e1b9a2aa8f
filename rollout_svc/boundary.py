"""What a rollout worker does with the groups it holds at each segment boundary.

After one engine call extends every held group by a segment, a finished group is scored and
delivered to the trajectory stream (waiting while the buffer is full), and the others' token
state is saved with the scheduler when due; a save's reply may recall a group for a repack,
and it is then handed over, with its KV states, to the worker the scheduler chose. Groups the
worker cannot finish are handed back, with their token state when it still has it.

RolloutWorker (rollout_svc.worker) drives this; tests/integration/test_partial_rollouts.py
exercises it through the worker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from relayrl.config import RolloutRun
from relayrl.contracts.leases import LeasedPrompt
from relayrl.contracts.messages import Group, Sample, validate_sample
from relayrl.contracts.partial import PartialGroup
from relayrl.contracts.streams import TrajectoryWriter
from relayrl.rules.repack import is_tail
from relayrl_tasks.rewards import get_reward, score_group
from rollout_svc.episodes import EpisodeGroup, episode_samples
from rollout_svc.group_generator import GroupGenerator
from rollout_svc.loop_clock import LoopClock
from rollout_svc.worker_leases import WorkerLeases

log = logging.getLogger(__name__)


@dataclass
class ActiveGroup:
    lease: LeasedPrompt
    group: PartialGroup | EpisodeGroup  # EpisodeGroup with rollout.environment set
    saved_at: float  # when its token state was last saved (or it started)


@dataclass(frozen=True)
class BoundarySettings:
    """What a segment boundary reads of the run's config, and the reward it scores with."""

    worker_id: str
    reward_name: str
    reward_range: tuple[float, float]  # buffer.reward_range (SubmitTerms)
    segment_tokens: int  # rollout.segment_tokens: 0 runs a group in one call, never saved
    save_every_s: float  # rollout.save_every_s
    repack_capacity: int  # LeaseTerms.repack_capacity: 0 with repacking off
    repack_below: float  # scheduler.repack_below (LeaseTerms)

    @classmethod
    def of(cls, cfg: RolloutRun, reward_name: str) -> BoundarySettings:
        return cls(worker_id=cfg.rollout.worker_id, reward_name=reward_name,
                   reward_range=cfg.submit.reward_range,
                   segment_tokens=cfg.rollout.segment_tokens,
                   save_every_s=cfg.rollout.save_every_s,
                   repack_capacity=cfg.lease.repack_capacity,
                   repack_below=cfg.lease.repack_below)


class SegmentBoundary:
    """Runs its groups through `generator` (and that generator's engine and model), makes its
    scheduler calls through `leases`, delivers to `writer`, times its parts on `loop` and
    reads the time for saves from `clock`."""

    def __init__(self, settings: BoundarySettings, generator: GroupGenerator,
                 leases: WorkerLeases, writer: TrajectoryWriter, loop: LoopClock,
                 clock: Callable[[], float]):
        self.settings = settings
        self.generator = generator
        self.leases = leases
        self.writer = writer
        self.reward_fn = get_reward(settings.reward_name)
        self.loop = loop
        self.clock = clock
        self.samples_generated = 0
        self.versions_used: set[int] = set()
        self.leases_released = 0
        self.groups_moved_out = 0  # handed over to another worker by a repack

    def activate(self, lease: LeasedPrompt) -> ActiveGroup:
        return ActiveGroup(lease, self.generator.start(lease), self.clock())

    def advance(self, active: list[ActiveGroup], stop: threading.Event | None = None
                ) -> tuple[list[ActiveGroup], int]:
        """One segment for every active group: finished groups are scored and delivered (a
        delivery waits while the buffer is full), the others' token state is saved with the
        scheduler when rollout.save_every_s has passed since their last save, or at once on
        a worker left with a tail (a save's reply may recall the group for a repack).
        Returns (the groups still held, how many were delivered)."""
        with self.loop.timed("generate"):
            self.generator.generate_segment([a.group for a in active])
        going = [a for a in active if not a.group.finished]
        delivered = 0
        for a in active:
            if a.group.finished:
                with self.loop.timed("deliver"):
                    self.deliver(a.lease, a.group, stop)
                delivered += 1
        if delivered:
            with self.loop.timed("deliver"):
                self.leases.confirm_deliveries()
        now = self.clock()
        due = self._due_for_saving(going, now)
        if not due:
            return going, delivered
        with self.loop.timed("save"):
            try:
                replies = self.leases.save_progress(
                    [(a.lease.lease_id, a.group.encode()) for a in due])
            except grpc.RpcError as err:  # saved or not, the next boundary saves again
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
        self.generator.drop([a.group for a in due if a.lease.lease_id in let_go])
        return [a for a in going if a.lease.lease_id not in let_go], delivered

    def _due_for_saving(self, going: list[ActiveGroup], now: float) -> list[ActiveGroup]:
        """The groups whose token state to save now: those unsaved for save_every_s, or all
        of them on a worker left with a tail when repacking is on (the scheduler's own rule,
        relayrl.rules.repack.is_tail): the planner learns a group's progress, and recalls it, only
        through saves."""
        s = self.settings
        if not s.segment_tokens:
            return []
        load = sum(len(a.group.unfinished()) for a in going)
        if s.repack_capacity and is_tail(load, s.repack_capacity, s.repack_below):
            return going
        return [a for a in going if now - a.saved_at >= s.save_every_s]

    def deliver(self, lease: LeasedPrompt, group: PartialGroup | EpisodeGroup,
                stop: threading.Event | None = None) -> None:
        if isinstance(group, EpisodeGroup):
            samples = episode_samples(lease, group, self.settings.worker_id, self.reward_fn,
                                      self.settings.reward_range)
        else:
            samples = self._samples(lease, group)
        for sample in samples:
            validate_sample(sample)  # where a rollout enters the run: checked once, here
            self.versions_used.update(sample.versions.tolist())
        # waits for room: this worker takes no new prompt
        self.writer.append(Group(lease.prompt_id, samples), stop)
        self.samples_generated += len(samples)
        self.leases.delivered(lease.lease_id)

    def _samples(self, lease: LeasedPrompt, group: PartialGroup) -> list[Sample]:
        lm = self.generator.lm
        scores = score_group(self.reward_fn, [lm.decode(s.tokens) for s in group.sequences],
                             lease.reference, lease.metadata, self.settings.reward_range,
                             prompt=lease.messages or lease.text)
        return [Sample(
            prompt_id=lease.prompt_id, lease_id=lease.lease_id,
            worker_id=self.settings.worker_id,
            prompt_tokens=group.prompt_tokens, response_tokens=seq.tokens,
            logprobs=seq.logprobs, versions=seq.versions, reward=reward, routes=seq.routes,
            finish_reason=seq.finish_reason, reward_error=error)
            for seq, (reward, error) in zip(group.sequences, scores, strict=True)]

    def hand_over(self, a: ActiveGroup) -> bool:
        """A repack recalled the group: hand it back (its token state was just saved) for
        the worker the scheduler chose. If the scheduler refuses, keep generating it."""
        kv = [self.generator.engine.export_state(a.group.prompt_tokens + s.tokens)
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
            self.release(a.lease.lease_id, a.group.encode())
        self.generator.drop([a.group for a in active])

    def release(self, lease_id: str, state: bytes = b"") -> bool:
        released = self.leases.hand_back(lease_id, state)
        self.leases_released += released
        return released

    def hand_back_abandoned(self, active: list[ActiveGroup]) -> None:
        """Release abandoned leases without state, for another worker to take now. Once a
        call fails the rest are only let go: the scheduler re-issues them when this worker's
        heartbeats no longer name them."""
        self.generator.drop([a.group for a in active])
        for i, a in enumerate(active):
            if not self.release(a.lease.lease_id):
                self.leases.let_go(rest.lease.lease_id for rest in active[i + 1:])
                return
