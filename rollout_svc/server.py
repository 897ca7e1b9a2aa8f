"""Rollout worker process: engine + loop, a gRPC endpoint for status and custom rollouts, and
optionally the OpenAI-compatible HTTP server."""

from __future__ import annotations

import logging
import threading

import grpc
import torch

from relayrl.config import RolloutRun, TorchEngineConfig
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.leases import GrpcLeaseClient
from relayrl.contracts.proto.v1 import rollout_pb2, rollout_pb2_grpc
from relayrl.contracts.streams import TrajectoryWriter
from relayrl.runtime import auth
from relayrl.runtime.logs import setup_logging
from relayrl.runtime.redis_conn import redis_session
from relayrl.runtime.service import ServiceRunner
from relayrl_tasks.tasks import check_reward
from relayrl_torch.models import resolve_model_path
from relayrl_torch.models.loading import load_model
from relayrl_torch.weights.client import RelayClient
from relayrl_torch.weights.collective import worker_device
from relayrl_torch.weights.signing import ManifestKeys
from rollout_svc.engines.factory import make_engine
from rollout_svc.serving.agent_episodes import AgentEpisodes, EpisodeRefused, buffer_submitter
from rollout_svc.serving.chat_turns import TurnMemories, credential_key
from rollout_svc.serving.generator import CustomGenerator
from rollout_svc.telemetry import rollout_metrics
from rollout_svc.worker import RolloutWorker

log = logging.getLogger(__name__)


EPISODE_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
                 409: grpc.StatusCode.FAILED_PRECONDITION,
                 429: grpc.StatusCode.RESOURCE_EXHAUSTED}  # EpisodeRefused.status


class RolloutServicer(rollout_pb2_grpc.RolloutServicer):
    """`episodes`: the OpenAI-compatible server's record of tagged episodes, whose rewards
    RewardEpisode takes as POST /v1/episodes/{episode}/reward does (None: it serves none)."""

    def __init__(self, worker: RolloutWorker, generator: CustomGenerator,
                 episodes: AgentEpisodes | None = None, by_credential: bool = True):
        self.worker = worker
        self.gen = generator
        self.episodes = episodes
        self.by_credential = by_credential  # False: no tokens checked, every caller is one

    def Status(self, request, context):
        w = self.worker
        pulls, gen, boundary = w.weights, w.generator, w.boundary
        return rollout_pb2.RolloutStatus(
            worker_id=w.worker_id, policy_version=w.engine.version,
            samples_generated=boundary.samples_generated, weight_swaps=pulls.weight_swaps,
            versions_used=sorted(boundary.versions_used),
            weight_pull_failures=pulls.pull_failures, bytes_pulled=pulls.bytes_pulled,
            last_pull_s=pulls.last_pull_s, segments=gen.segments,
            mid_sequence_swaps=gen.mid_sequence_swaps, groups_resumed=gen.groups_resumed,
            leases_released=boundary.leases_released,
            groups_moved_out=boundary.groups_moved_out,
            kv_imported=gen.kv_imported, kv_refused=gen.kv_refused,
            tokens_resumed=int(w.engine.stats().get("tokens_resumed", 0)),
            engine=w.engine.name,
            custom_requests=self.gen.batcher.requests,
            custom_engine_calls=self.gen.batcher.batches)

    def _request(self, request, context):
        try:
            return self.gen.request(
                text=request.text, token_ids=list(request.token_ids),
                max_new_tokens=request.max_new_tokens, temperature=request.temperature,
                n=request.n, greedy=request.greedy, seed=request.seed,
                ignore_eos=request.ignore_eos, where="GenerateRequest")
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))

    def Generate(self, request, context):
        req = self._request(request, context)
        version, outs = self.gen.generate(req)
        return rollout_pb2.GenerateResponse(
            prompt_token_ids=req.prompt, policy_version=version,
            sequences=[rollout_pb2.GeneratedSequence(
                token_ids=o.tokens, logprobs=o.logprobs, versions=[version] * len(o.tokens),
                finish_reason=o.finish_reason, text=self.gen.decode(o.tokens)) for o in outs])

    def RewardEpisode(self, request, context):
        if self.episodes is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "episodes: this worker serves no "
                          "OpenAI-compatible server (rollout.http_base_port 0)")
        caller = dict(context.invocation_metadata()).get("authorization")
        owner = credential_key(caller if self.by_credential else None)
        try:
            status = self.episodes.reward(owner, request.episode, request.reward)
        except EpisodeRefused as err:
            context.abort(EPISODE_CODES[err.status], f"EpisodeRewardRequest.{err}")
        return rollout_pb2.EpisodeRewardReply(episode=request.episode, status=status)

    def GenerateStream(self, request, context):
        req = self._request(request, context)
        try:
            chunks = self.gen.stream(req, request.chunk_tokens or 1)
            first = True
            for c in chunks:
                yield rollout_pb2.GenerateChunk(
                    index=c.index, token_ids=c.tokens, logprobs=c.logprobs,
                    policy_version=c.version, finish_reason=c.finish_reason,
                    text=self.gen.decode(c.tokens),
                    prompt_token_ids=req.prompt if first else [])
                first = False
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"GenerateRequest.{err}")


def serve(cfg: RolloutRun) -> None:
    setup_logging(cfg.rollout.worker_id)
    torch.set_num_threads(cfg.rollout.torch_threads)
    # before the model loads: a worker set for the nccl plane on a machine without CUDA stops
    weight_device = worker_device(cfg.rollout.weight_plane, cfg.rollout.weight_device)
    model_path = resolve_model_path(cfg.model, cfg.task)
    # the torch engine samples with these weights; vLLM loads its own, and this process
    # then needs the tokenizer only
    lm = load_model(model_path, cfg.model.dtype_name(),
                    weights=isinstance(cfg.rollout.engine, TorchEngineConfig))
    engine = make_engine(cfg, lm, model_path)
    log.info("%s engine on %s", engine.name, getattr(engine, "device", "its own device"))
    with redis_session(cfg.redis.url, cfg.run_dir, cfg.redis.socket_timeout_s) as redis:
        scheduler = GrpcLeaseClient(cfg.lease.address, cfg.lease.call_timeout_s)
        keys = ManifestKeys(verifier=ManifestKeys.from_config(cfg.auth).verifier)
        relays = [RelayClient(a, cfg.relays.chunk_bytes, cfg.relays.timeout_s,
                              cfg.rollout.weight_plane, weight_device, keys=keys)
                  for a in cfg.relays.addresses]
        worker = RolloutWorker(cfg, engine, lm, scheduler, relays,
                               TrajectoryWriter(redis, RunKeys(cfg.run_id),
                                                cfg.submit.max_pending_samples),
                               check_reward(cfg.task))
        generator = CustomGenerator(engine, lm, cfg.rollout)
        turns = TurnMemories(cfg.rollout.turn_memory_per_agent)  # the HTTP server's, if any
        episodes = (AgentEpisodes(cfg.groups.group_size, cfg.rollout.agent_episodes,
                                  cfg.task.reward_range,
                                  buffer_submitter(cfg.submit.address, cfg.rollout.worker_id))
                    if cfg.rollout.http_base_port else None)
        runner = ServiceRunner(cfg.rollout.worker_id, cfg.rollout.endpoint.bind_address,
                               [(rollout_pb2_grpc.add_RolloutServicer_to_server,
                                 RolloutServicer(worker, generator, episodes,
                                                 auth.current().book is not None))],
                               rollout_metrics(worker, generator.batcher, turns, episodes),
                               cfg.rollout.metrics_port,
                               max_receive_bytes=cfg.rollout.grpc_receive_bytes,
                               max_concurrent_rpcs=cfg.rollout.grpc.max_concurrent_rpcs)
        http, swept = None, threading.Event()
        if cfg.rollout.http_base_port:
            from rollout_svc.serving.openai_server import OpenAIServer

            http = OpenAIServer(generator, cfg.rollout.http_host,
                                cfg.rollout.http_base_port + cfg.rollout.worker_index,
                                model_name=cfg.rollout.served_model_name, turns=turns,
                                episodes=episodes)
            http.start()
            threading.Thread(target=episodes.run_sweeps, args=(swept,), daemon=True,
                             name="agent-episodes").start()
        try:
            runner.run(worker.run)
        finally:
            swept.set()
            if http is not None:
                http.stop()
