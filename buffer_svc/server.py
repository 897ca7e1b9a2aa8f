"""The buffer service: trajectory stream -> groups -> batch stream, exactly once.

Trajectory entries are acknowledged (and deleted) in the same transaction that appends the
batch holding them, so a crash at any point leaves them pending to be read again.
"""

from __future__ import annotations

import logging
import threading

import grpc

from buffer_svc.assembler import GroupAssembler, ReadyBatch
from buffer_svc.submit import Submissions
from buffer_svc.telemetry import buffer_metrics
from relayrl import control
from relayrl.codec import CodecError
from relayrl.config import RunConfig
from relayrl.keys import BUFFER_GROUP, RunKeys
from relayrl.logs import setup_logging
from relayrl.messages import decode_sample, encode_batch
from relayrl.proto.v1 import buffer_pb2, buffer_pb2_grpc
from relayrl.redis_conn import open_redis
from relayrl.service import ServiceRunner
from relayrl.streams import FIELD, ensure_group, read_group

log = logging.getLogger(__name__)
CONSUMER = "buffer-0"


class BufferService(buffer_pb2_grpc.BufferServicer):
    def __init__(self, cfg: RunConfig, redis):
        self.cfg = cfg
        self.r = redis
        self.keys = RunKeys(cfg.run_id)
        self.asm = GroupAssembler(cfg.buffer.group_size, cfg.buffer.groups_per_batch)
        self.lock = threading.Lock()
        self.samples_read = 0
        self.samples_rejected = 0
        self.batches_emitted = 0
        self.submissions = Submissions(redis, self.keys, cfg.buffer.group_size)
        ensure_group(self.r, self.keys.trajectories, BUFFER_GROUP)

    def _stopping(self) -> bool:
        return control.read_run_state(self.r, self.keys) is control.RunState.STOPPING

    def _already_batched(self, prompt_id: int) -> bool:
        return bool(self.r.sismember(self.keys.ledger("batched"), prompt_id))

    def _emit(self, ready: ReadyBatch) -> None:
        prompt_ids = [g.prompt_id for g in ready.batch.groups]
        pipe = self.r.pipeline(transaction=True)
        pipe.xadd(self.keys.batches, {FIELD: encode_batch(ready.batch)})
        pipe.sadd(self.keys.ledger("batched"), *prompt_ids)
        pipe.xack(self.keys.trajectories, BUFFER_GROUP, *ready.entry_ids)
        pipe.xdel(self.keys.trajectories, *ready.entry_ids)
        pipe.execute()
        self.batches_emitted += 1
        log.info("batch %s: %d groups, prompts %s", ready.batch.batch_id[:8],
                 len(prompt_ids), prompt_ids)

    def _drop(self, entry_ids: list[bytes]) -> None:
        if entry_ids:
            pipe = self.r.pipeline(transaction=True)
            pipe.xack(self.keys.trajectories, BUFFER_GROUP, *entry_ids)
            pipe.xdel(self.keys.trajectories, *entry_ids)
            pipe.execute()

    def poll(self, pending_after: bytes | None = None) -> list[bytes]:
        entries = read_group(self.r, self.keys.trajectories, BUFFER_GROUP, CONSUMER, count=256,
                             block_ms=self.cfg.buffer.read_block_ms, pending_after=pending_after)
        with self.lock:
            for entry_id, payload in entries:
                self.samples_read += 1
                try:
                    if payload is None:
                        raise CodecError("entry has no data field")
                    sample = decode_sample(payload)
                except CodecError as err:
                    self.samples_rejected += 1
                    log.warning("rejected trajectory entry %s: %s", entry_id, err)
                    self.asm.discard.append(entry_id)
                    continue
                self.asm.add(entry_id, sample, self._already_batched)
            self._drop(self.asm.take_discard())
            short_ok = self._stopping()  # the last few groups of a stopping run go too
            while (ready := self.asm.take_batch(short_ok)) is not None:
                self._emit(ready)
        return [e for e, _ in entries]

    def run(self, stop: threading.Event) -> None:
        after = b"0"  # first the entries read before a restart and never acknowledged
        while ids := self.poll(pending_after=after):
            after = ids[-1]
        while not stop.is_set():
            self.poll()

    def Stats(self, request, context):
        with self.lock:
            return buffer_pb2.BufferStats(
                samples_read=self.samples_read, groups_assembled=self.asm.groups_assembled,
                groups_duplicate=self.asm.groups_duplicate, batches_emitted=self.batches_emitted,
                partial_groups=len(self.asm.partial), ready_groups=len(self.asm.ready),
                trajectory_stream_len=self.r.xlen(self.keys.trajectories),
                batch_stream_len=self.r.xlen(self.keys.batches),
                samples_rejected=self.samples_rejected,
                groups_submitted=self.submissions.accepted,
                submits_refused=self.submissions.refused)

    def Submit(self, request, context):
        try:
            prompt_id = self.submissions.submit(request)
        except CodecError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        log.info("accepted an external group from %s as prompt %d",
                 request.source or "an unnamed source", prompt_id)
        return buffer_pb2.SubmitResponse(prompt_id=prompt_id)


def serve(cfg: RunConfig) -> None:
    setup_logging("buffer")
    redis, _embedded = open_redis(cfg.redis.url, cfg.run_dir, cfg.redis.socket_timeout_s)
    svc = BufferService(cfg, redis)
    runner = ServiceRunner("buffer", cfg.buffer.endpoint.address,
                           [(buffer_pb2_grpc.add_BufferServicer_to_server, svc)],
                           buffer_metrics(svc), cfg.buffer.metrics_port)
    runner.run(svc.run)
