"""The buffer service: trajectory stream (one entry per group) -> batch stream, exactly once.

Trajectory entries are acknowledged (and deleted) in the same transaction that appends the
batch holding them, so a crash at any point leaves them pending to be read again.

Both streams are bounded: producers admit themselves onto the trajectory stream only under
buffer.max_pending_samples (relayrl.contracts.streams), and this service appends a batch only while
fewer than buffer.max_pending_batches wait unread by the trainer. A slow trainer therefore
fills the batch stream, then the trajectory stream, then makes producers wait.
"""

from __future__ import annotations

import logging
import threading

import grpc
from redis import ResponseError

from buffer_svc.assembler import GroupAssembler, ReadyBatch
from buffer_svc.emit import BatchAppender
from buffer_svc.submit import StaleGroup, Submissions, shown_source
from buffer_svc.telemetry import BufferStats, StreamStats, buffer_metrics
from relayrl.config import BufferRun
from relayrl.contracts import control, ledger
from relayrl.contracts.codec import CodecError
from relayrl.contracts.keys import BUFFER_GROUP, TRAINER_GROUP, RunKeys
from relayrl.contracts.messages import Group, decode_group, encode_batch
from relayrl.contracts.proto.v1 import buffer_pb2, buffer_pb2_grpc
from relayrl.contracts.streams import BufferFull, ensure_group, pending_samples, read_group
from relayrl.runtime.backpressure import PressureCounters, StoppedWaiting, is_oom
from relayrl.runtime.logs import setup_logging
from relayrl.runtime.outage import is_outage, redis_write, ride_out
from relayrl.runtime.redis_conn import redis_session
from relayrl.runtime.reply_faults import with_lost_replies
from relayrl.runtime.service import ServiceRunner

log = logging.getLogger(__name__)
CONSUMER = "buffer-0"
# what a chaos test may lose the replies of (relayrl.runtime.reply_faults); Stats is how it watches
LOSABLE_METHODS = ("Submit",)


class BufferService(buffer_pb2_grpc.BufferServicer):
    def __init__(self, cfg: BufferRun, redis):
        self.cfg = cfg
        self.r = redis
        self.keys = RunKeys(cfg.run_id)
        self.asm = GroupAssembler(cfg.buffer.groups_per_batch)
        self.lock = threading.Lock()
        self.samples_read = 0
        self.samples_rejected = 0  # entries refused: their samples cannot be counted
        self.batches_emitted = 0
        self.batches_held = 0  # polls that kept a complete batch back for want of room
        self.pressure = PressureCounters()  # this service's own writes refused for memory
        self.appender = BatchAppender(redis, self.keys)
        # learned once: Submit checks every token against the model the run trains
        model = cfg.model.limits()
        log.info("Submit limits: vocabulary %d, context %d tokens (%s); rewards in %s",
                 model.vocab_size, model.context_length, model.source, cfg.task.reward_range)
        self.submissions = Submissions(redis, cfg, model)
        self.stop = threading.Event()
        self.taken_up_to = b"0"  # the last trajectory entry read into the assembler
        ensure_group(self.r, self.keys.trajectories, BUFFER_GROUP)
        # created here too (both from the start), so unread batches can be counted at once
        ensure_group(self.r, self.keys.batches, TRAINER_GROUP)

    def _stopping(self) -> bool:
        return control.read_run_state(self.r, self.keys) is control.RunState.STOPPING

    def _already_batched(self, prompt_id: int) -> bool:
        # waited out here: the entries read before this one are in the assembler already
        return ride_out("redis", lambda: ledger.contains(self.r, self.keys, "batched",
                                                         prompt_id), self.stop)

    def pending_samples(self) -> int:
        """Samples on the trajectory stream (buffer.max_pending_samples bounds them)."""
        return pending_samples(self.r, self.keys, self.cfg.buffer.group_size)

    def unread_batches(self) -> int:
        """Batches on the batch stream the trainer has not been handed yet (a read batch
        stays pending until the checkpoint that acknowledges it)."""
        pipe = self.r.pipeline(transaction=False)  # Redis refuses MULTI at its memory limit
        pipe.xlen(self.keys.batches)
        pipe.xpending(self.keys.batches, TRAINER_GROUP)
        length, pending = pipe.execute()
        return length - pending["pending"]

    def stats_snapshot(self) -> tuple[BufferStats, StreamStats]:
        """What /metrics shows, read now."""
        with self.lock:
            subs = self.submissions
            own = BufferStats.from_attributes(
                self, self.asm, redis_oom_refusals=self.pressure.oom_refusals,
                groups_submitted=subs.accepted, submits_refused=subs.refused,
                submits_stale=subs.stale, submits_repeated=subs.repeated,
                partial_groups=0, ready_groups=len(self.asm.ready))
        # Redis round trips outside the lock: the poll loop needs it
        streams = StreamStats(trajectory_stream_len=self.pending_samples(),
                              batch_stream_len=self.r.xlen(self.keys.batches),
                              batches_unread=self.unread_batches())
        return own, streams

    def _emit(self, ready: ReadyBatch) -> None:
        prompt_ids = [g.prompt_id for g in ready.batch.groups]
        payload = encode_batch(ready.batch)

        def write() -> None:
            if not self.appender.append(payload, prompt_ids, ready.entry_ids):
                log.warning("batch %s had been appended already (a repeated call); not "
                            "appended again", ready.batch.batch_id[:8])

        # a refused transaction wrote nothing, a repeated one appends nothing (BatchAppender);
        # if we stop meanwhile, the entries stay pending and are read again after a restart
        redis_write(write, self.pressure, "the buffer's batch append", self.stop)
        self.batches_emitted += 1
        log.info("batch %s: %d groups, prompts %s", ready.batch.batch_id[:8],
                 len(prompt_ids), prompt_ids)

    def _drop(self, entry_ids: list[bytes]) -> None:
        def write() -> None:
            pipe = self.r.pipeline(transaction=True)
            pipe.xack(self.keys.trajectories, BUFFER_GROUP, *entry_ids)
            pipe.xdel(self.keys.trajectories, *entry_ids)
            pipe.execute()

        if entry_ids:  # at its memory limit Redis refuses any MULTI, even one that frees
            redis_write(write, self.pressure, "the buffer's drop of duplicates", self.stop)

    def _decode(self, payload: bytes | None) -> Group:
        """A trajectory entry as its group; the samples were checked where they entered
        (the worker's delivery, Submit), so only the decoding by type is left."""
        if payload is None:
            raise CodecError("entry has no data field")
        group = decode_group(payload)
        if len(group.samples) != self.cfg.buffer.group_size:
            raise CodecError(f"group.samples: {len(group.samples)} samples, a group is "
                             f"buffer.group_size ({self.cfg.buffer.group_size})")
        return group

    def poll(self, pending_after: bytes | None = None) -> list[bytes]:
        entries = read_group(self.r, self.keys.trajectories, BUFFER_GROUP, CONSUMER, count=256,
                             block_ms=self.cfg.buffer.read_block_ms, pending_after=pending_after)
        with self.lock:
            for entry_id, payload in entries:
                try:
                    group = self._decode(payload)
                except CodecError as err:
                    self.samples_rejected += 1
                    log.warning("rejected trajectory entry %s: %s", entry_id, err)
                    self.asm.discard.append(entry_id)
                else:
                    self.samples_read += len(group.samples)
                    self.asm.add(entry_id, group, self._already_batched)
                self.taken_up_to = entry_id
            self._drop(self.asm.take_discard())
        self._emit_ready()
        return [e for e, _ in entries]

    def _emit_ready(self) -> None:
        """Append complete batches while the trainer has room for them. Outside the lock: an
        append may wait for Redis, and Stats and /metrics must still answer."""
        room = self.cfg.buffer.max_pending_batches - self.unread_batches()
        short_ok = self._stopping()  # the last few groups of a stopping run go too
        while True:
            with self.lock:
                if not self.asm.ready or (len(self.asm.ready) < self.asm.groups_per_batch
                                          and not short_ok):
                    return
                if room <= 0:
                    self.batches_held += 1
                    return
                ready = self.asm.take_batch(short_ok)
            self._emit(ready)
            room -= 1

    def _poll_round(self) -> None:
        """First the entries this consumer was handed but never took in: after a restart,
        those read before it; after an outage, those of a read whose reply was lost. Then
        new ones."""
        if not self.poll(pending_after=self.taken_up_to):
            self.poll()

    def run(self, stop: threading.Event) -> None:
        self.stop = stop
        try:
            while not stop.is_set():
                ride_out("redis", self._poll_round, stop)
        except StoppedWaiting:
            log.info("stopped while Redis refused writes; unbatched entries stay pending")

    def Stats(self, request, context):
        with self.lock:
            return buffer_pb2.BufferStats(
                samples_read=self.samples_read, groups_assembled=self.asm.groups_assembled,
                groups_duplicate=self.asm.groups_duplicate, batches_emitted=self.batches_emitted,
                partial_groups=0,  # a group enters whole (one entry): none is ever partial
                ready_groups=len(self.asm.ready),
                trajectory_stream_len=self.pending_samples(),
                batch_stream_len=self.r.xlen(self.keys.batches),
                samples_rejected=self.samples_rejected,
                groups_submitted=self.submissions.accepted,
                submits_refused=self.submissions.refused,
                submits_stale=self.submissions.stale,
                submits_repeated=self.submissions.repeated)

    def Submit(self, request, context):
        try:
            prompt_id, repeated = self.submissions.submit(request)
        except CodecError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except StaleGroup as err:  # well-formed; the trainer's version has moved past it
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except BufferFull as err:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        except ResponseError as err:
            if not is_oom(err):
                raise
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"Redis is at its memory limit; retry later ({err})")
        except Exception as err:
            if not is_outage(err):
                raise
            context.abort(grpc.StatusCode.UNAVAILABLE, f"Redis is unreachable; retry later "
                          f"({type(err).__name__}: {err})")
        log.info("%s an external group from %s as prompt %d",
                 "repeated Submit: already had" if repeated else "accepted",
                 shown_source(request.source), prompt_id)
        return buffer_pb2.SubmitResponse(prompt_id=prompt_id)


def serve(cfg: BufferRun) -> None:
    setup_logging("buffer")
    with redis_session(cfg.redis.url, cfg.run_dir, cfg.redis.socket_timeout_s) as redis:
        svc = BufferService(cfg, redis)
        servicer = with_lost_replies(svc, "Buffer", LOSABLE_METHODS)
        runner = ServiceRunner("buffer", cfg.buffer.endpoint.bind_address,
                               [(buffer_pb2_grpc.add_BufferServicer_to_server, servicer)],
                               buffer_metrics(svc.stats_snapshot), cfg.buffer.metrics_port,
                               max_receive_bytes=cfg.buffer.grpc_receive_bytes,
                               max_concurrent_rpcs=cfg.buffer.grpc.max_concurrent_rpcs)
        runner.run(svc.run)
