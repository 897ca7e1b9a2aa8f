"""The rollout loop: refresh weights between sequences, lease, generate, score, append."""

from __future__ import annotations

import logging
import threading
import time

import grpc
import redis
import torch

from relayrl.config import RunConfig
from relayrl.leases import LeaseClient, LeasedPrompt
from relayrl.messages import Sample
from relayrl.models import LoadedModel
from relayrl.rewards import get_reward, score
from relayrl.streams import TrajectoryWriter
from relayrl.weights import WeightError, WeightPlane
from relayrl.weights.layout import flat_size
from rollout_svc.engine import Engine

log = logging.getLogger(__name__)


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
        self.samples_generated = 0
        self.weight_swaps = 0
        self.pull_failures = 0
        self.bytes_pulled = 0
        self.last_pull_s = 0.0
        self.versions_used: set[int] = set()
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

    def run_lease(self, prompt: LeasedPrompt) -> None:
        prompt_tokens = self.lm.encode_prompt(prompt.text)
        gens = self.engine.generate(prompt_tokens, self.cfg.rollout.samples_per_prompt)
        samples = []
        for g in gens:
            reward, error = score(self.reward_fn, self.lm.decode(g.tokens), prompt.reference)
            samples.append(Sample(
                prompt_id=prompt.prompt_id, lease_id=prompt.lease_id, worker_id=self.worker_id,
                prompt_tokens=prompt_tokens, response_tokens=g.tokens, logprobs=g.logprobs,
                versions=g.versions, reward=reward, finish_reason=g.finish_reason,
                reward_error=error))
            self.versions_used.update(g.versions)
        self.writer.append(samples)
        self.samples_generated += len(samples)
        self.scheduler.complete(self.worker_id, prompt.lease_id)

    def run(self, stop: threading.Event) -> None:
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
                if stop.is_set():
                    break  # the unfinished lease lapses and is re-issued elsewhere
                try:
                    self.run_lease(lease)
                except (grpc.RpcError, redis.RedisError) as err:
                    # the lease lapses and is re-issued; anything already appended is
                    # de-duplicated by the buffer
                    log.warning("lease %s abandoned: %s", lease.lease_id, err)
                    stop.wait(1.0)
