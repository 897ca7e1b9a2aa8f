"""The rollout loop: refresh weights between sequences, lease, generate, score, append."""

from __future__ import annotations

import logging
import threading
import time

import grpc
import redis
import torch

from relayrl.codec import CodecError
from relayrl.config import RunConfig
from relayrl.leases import LeaseClient, LeasedPrompt
from relayrl.messages import Sample
from relayrl.models import LoadedModel
from relayrl.partial import PartialGroup
from relayrl.rewards import get_reward, score
from relayrl.streams import TrajectoryWriter
from relayrl.weights import WeightError, WeightPlane
from relayrl.weights.layout import flat_size
from rollout_svc.engine import Engine, SamplingSpec

log = logging.getLogger(__name__)
SERVE_ONLY_POLL_S = 1.0


class RolloutWorker:
    def __init__(self, cfg: RunConfig, engine: Engine, lm: LoadedModel,
                 scheduler: LeaseClient, relays: list[WeightPlane],
                 writer: TrajectoryWriter, reward_name: str):
        self.cfg = cfg
        self.worker_id = cfg.rollout.worker_id
        self.engine = engine
        self.lm = lm
        self.scheduler = scheduler
        if not relays:
            raise ValueError("rollout.relays: a worker needs at least one relay")
        self.relays = relays
        self.writer = writer
        self.reward_fn = get_reward(reward_name)
        self.prompt_format = cfg.task.prompt_format
        self.samples_generated = 0
        self.weight_swaps = 0
        self.pull_failures = 0
        self.bytes_pulled = 0
        self.last_pull_s = 0.0
        self.versions_used: set[int] = set()
        self.segments = 0
        self.mid_sequence_swaps = 0  # sequences that continued under a newer version
        self.groups_resumed = 0  # leases that came with another worker's token state
        self.leases_released = 0
        self._staging: torch.Tensor | None = None  # receive buffer reused across pulls

    def refresh_weights(self) -> bool:
        """Move to the newest version any relay offers, trying relays in order. A relay that
        is down or serves anything that fails verification is skipped; if none succeeds the
        engine stays, whole, on the version it has. True if the engine moved."""
        for relay in self.relays:
            try:
                manifest = relay.manifest(0)
                if manifest is None or manifest.version <= self.engine.version:
                    return False
                t0 = time.monotonic()
                size = flat_size(manifest)
                if self._staging is None or self._staging.numel() < size:
                    self._staging = torch.empty(size, dtype=torch.uint8)
                tensors = relay.pull(manifest.version, staging=self._staging)
                self.engine.load_weights(tensors, manifest.version)
            except (WeightError, ValueError, grpc.RpcError) as err:
                self.pull_failures += 1
                log.warning("weight refresh from %s failed, still on version %d: %s",
                            getattr(relay, "address", "relay"), self.engine.version, err)
                continue
            self.weight_swaps += 1
            self.bytes_pulled += manifest.total_bytes
            self.last_pull_s = time.monotonic() - t0
            log.info("now on version %d (%.0f ms)", manifest.version, 1e3 * self.last_pull_s)
            return True
        return False

    def register(self) -> None:
        self.scheduler.register(self.worker_id, self.cfg.rollout.endpoint.address)

    def heartbeat_loop(self, stop: threading.Event) -> None:
        interval = self.cfg.scheduler.heartbeat_interval_s
        while not stop.wait(interval):
            try:
                if not self.scheduler.heartbeat(self.worker_id, self.engine.version):
                    self.register()
            except grpc.RpcError as err:
                log.warning("heartbeat failed: %s", err.code())

    def _start_group(self, lease: LeasedPrompt, prompt_tokens: list[int]) -> PartialGroup:
        n = self.cfg.rollout.samples_per_prompt
        if lease.partial_state:
            try:
                group = PartialGroup.decode(lease.partial_state, lease.prompt_id, n)
                self.groups_resumed += 1
                return group
            except CodecError as err:  # the scheduler checked it; start over rather than die
                log.warning("lease %s: saved state unusable (%s); starting over",
                            lease.lease_id, err)
        return PartialGroup.fresh(lease.prompt_id, prompt_tokens, n)

    def generate_segment(self, group: PartialGroup) -> None:
        """Extend every unfinished sequence by at most one segment under the engine's
        current weights; every new token is tagged with that version."""
        rc = self.cfg.rollout
        todo = group.unfinished()
        # unfinished sequences of a group advance in lockstep, so they share a budget
        room = rc.max_new_tokens - max(len(s.tokens) for s in todo)
        budget = min(room, rc.segment_tokens) if rc.segment_tokens else room
        spec = SamplingSpec(max_new_tokens=budget, temperature=rc.temperature)
        with self.engine.lock:  # no swap between reading the version and sampling with it
            version = self.engine.version
            outs = self.engine.generate([group.prompt_tokens + s.tokens for s in todo], spec)
        for seq, out in zip(todo, outs, strict=True):
            if seq.versions and seq.versions[-1] != version:
                self.mid_sequence_swaps += 1
            seq.extend(out.tokens, out.logprobs, version)
            if out.finish_reason == "stop":
                seq.finish_reason = "stop"
            elif len(seq.tokens) >= rc.max_new_tokens:
                seq.finish_reason = "length"
        self.segments += 1

    def run_lease(self, lease: LeasedPrompt, stop: threading.Event | None = None) -> bool:
        """Generate, score and deliver one prompt's group, segment by segment, moving to newer
        weights and saving the token state at each boundary. Returns False if it stopped
        first, having handed the lease back with the state so far."""
        prompt_tokens = self.lm.encode_task(lease.text, self.prompt_format)
        group = self._start_group(lease, prompt_tokens)
        first = True
        while not group.finished:
            if not first:
                if stop is not None and stop.is_set():
                    self.scheduler.release(self.worker_id, lease.lease_id, group.encode())
                    self.leases_released += 1
                    return False
                self.refresh_weights()
            self.generate_segment(group)
            if not group.finished and self.cfg.rollout.segment_tokens:
                if not self.scheduler.save_progress(self.worker_id, lease.lease_id,
                                                    group.encode()):
                    log.warning("lease %s lapsed mid-generation; dropping it", lease.lease_id)
                    return False
            first = False
        self.deliver(lease, group)
        return True

    def deliver(self, lease: LeasedPrompt, group: PartialGroup) -> None:
        samples = []
        for seq in group.sequences:
            reward, error = score(self.reward_fn, self.lm.decode(seq.tokens), lease.reference)
            samples.append(Sample(
                prompt_id=lease.prompt_id, lease_id=lease.lease_id, worker_id=self.worker_id,
                prompt_tokens=group.prompt_tokens, response_tokens=seq.tokens,
                logprobs=seq.logprobs, versions=seq.versions, reward=reward,
                finish_reason=seq.finish_reason, reward_error=error))
            self.versions_used.update(seq.versions)
        self.writer.append(samples)
        self.samples_generated += len(samples)
        self.scheduler.complete(self.worker_id, lease.lease_id)

    def run(self, stop: threading.Event) -> None:
        if not self.cfg.rollout.train_loop:  # custom rollouts only: just follow the weights
            while not stop.is_set():
                self.refresh_weights()
                stop.wait(SERVE_ONLY_POLL_S)
            return
        self.register()
        beats = threading.Thread(target=self.heartbeat_loop, args=(stop,), daemon=True)
        beats.start()
        while not stop.is_set():
            self.refresh_weights()
            try:
                resp = self.scheduler.acquire(self.worker_id, self.cfg.rollout.prompts_per_lease)
            except grpc.RpcError as err:
                log.warning("scheduler unavailable (%s); retrying", err.code())
                stop.wait(1.0)
                continue
            if resp.done:
                log.info("scheduler has no more prompts; idling")
                stop.wait(1.0)
                continue
            if not resp.leases:
                stop.wait(resp.retry_after_s or 0.05)
                continue
            for lease in resp.leases:
                try:
                    if stop.is_set():  # not started: hand it back for re-issue now
                        self.scheduler.release(self.worker_id, lease.lease_id)
                        self.leases_released += 1
                        continue
                    self.run_lease(lease, stop)
                except (grpc.RpcError, redis.RedisError) as err:
                    # the lease lapses and is re-issued; anything already appended is
                    # de-duplicated by the buffer
                    log.warning("lease %s abandoned: %s", lease.lease_id, err)
                    stop.wait(1.0)
