"""Externally produced groups (custom rollouts) into the trajectory stream.

Submit is where an agent's samples enter the run, so this is where they are checked, once,
against the model the run trains and the run's bounds: token ids inside the vocabulary, the
sequence inside the context length, rewards inside task.reward_range, versions the
trainer would still train on, and a `source` of at most MAX_SOURCE_CHARS. A group passes
whole or writes nothing; it is then given a prompt id from the external range and appended
as one entry, its source stored once on the group, so the buffer batches it on the same
exactly-once path as the workers' groups. Nothing downstream checks a sample again.

A client's request_id makes a retried Submit (its reply lost) a repeat, not a second group:
the script that appends the group records the id with it, so an id is remembered exactly
when its group went in.
"""

from __future__ import annotations

import hashlib
import re
import reprlib
from dataclasses import dataclass

from relayrl.config import BufferRun, ModelLimits
from relayrl.contracts import control
from relayrl.contracts.codec import CodecError, from_proto
from relayrl.contracts.keys import EXTERNAL_PROMPT_BASE, RunKeys
from relayrl.contracts.messages import (
    Group,
    Sample,
    SampleLimits,
    encode_group,
    validate_sample,
)
from relayrl.contracts.proto.v1 import buffer_pb2
from relayrl.contracts.streams import BufferFull
from relayrl.rules.staleness import is_stale

REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# SubmitRequest.source names the producer for the logs: a name, not a payload
MAX_SOURCE_CHARS = 256
EXTERNAL_WORKER = "external"  # every submitted sample's worker_id

# KEYS: the trajectory stream[, the request's id key]. ARGV: the stream's bound, the id's
# time to live, what to remember under it, the group's size, then the group. A known id
# appends nothing; otherwise the group goes in as one entry, under the bound
# (relayrl.contracts.streams.ADMIT_SCRIPT's rule), and the id with it. Redis refuses a script for
# its memory limit at its first write (XADD), so a refused group writes nothing.
SUBMIT_SCRIPT = """
if KEYS[2] then
  local seen = redis.call('GET', KEYS[2])
  if seen then return {2, seen} end
end
local size = tonumber(ARGV[4])
local depth = redis.call('XLEN', KEYS[1]) * size
if depth + size > tonumber(ARGV[1]) then return {0, depth} end
redis.call('XADD', KEYS[1], '*', 'data', ARGV[5])
if KEYS[2] then redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[2]) end
return {1}
"""


class StaleGroup(Exception):
    """A well-formed group the trainer would drop unseen: its tokens are too old already."""


@dataclass(frozen=True)
class SubmitLimits:
    group_size: int  # buffer.group_size
    model: ModelLimits
    reward_range: tuple[float, float]  # task.reward_range

    def of_samples(self, latest_version: int) -> SampleLimits:
        return SampleLimits(self.model.vocab_size, self.model.context_length, self.model.source,
                            self.reward_range, latest_version, self.model.experts)


def to_samples(request: buffer_pb2.SubmitRequest, limits: SubmitLimits,
               latest_version: int) -> list[Sample]:
    """The group as samples (under a placeholder prompt id), each made from its Trajectory
    (the same fields by the same names) and checked by validate_sample against the run's
    limits; or a CodecError that names the field, the value and the limit."""
    check_source(request.source)
    trajs = request.trajectories
    if len(trajs) != limits.group_size:
        raise CodecError(f"SubmitRequest.trajectories: {len(trajs)} given, a group is "
                         f"buffer.group_size ({limits.group_size})")
    bounds = limits.of_samples(latest_version)
    samples = []
    for i, t in enumerate(trajs):
        try:
            sample = from_proto(t, Sample, prompt_id=EXTERNAL_PROMPT_BASE, lease_id="",
                                worker_id=EXTERNAL_WORKER)
            validate_sample(sample, bounds)
        except CodecError as err:  # "sample.versions[2]: ..." of this trajectory
            raise CodecError(f"SubmitRequest.trajectories[{i}]"
                             f"{str(err).removeprefix('sample')}") from None
        samples.append(sample)
    return samples


def check_source(source: str) -> None:
    """A CodecError when SubmitRequest.source is longer than MAX_SOURCE_CHARS."""
    if len(source) > MAX_SOURCE_CHARS:
        raise CodecError(f"SubmitRequest.source: {len(source)} characters, over the limit of "
                         f"{MAX_SOURCE_CHARS} (starts {shown_source(source)})")


def shown_source(source: str) -> str:
    """`source` as the logs show it: escaped, quoted, at most 60 characters of it."""
    return _SHOWN.repr(source) if source else "an unnamed source"


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = 62


def check_fresh(samples: list[Sample], latest_version: int, max_staleness: int) -> None:
    """StaleGroup when the trainer, already at `latest_version`, would drop the group as
    stale (relayrl.rules.staleness.is_stale: its version only grows from here)."""
    oldest = Group(EXTERNAL_PROMPT_BASE, samples).oldest_version
    if is_stale(oldest, latest_version, max_staleness):
        i = next(i for i, s in enumerate(samples) if s.oldest_version == oldest)
        raise StaleGroup(
            f"SubmitRequest.trajectories[{i}].versions: the group's oldest policy token is of "
            f"version {oldest}, {latest_version - oldest} behind the trainer's latest version "
            f"{latest_version}, over trainer.max_staleness ({max_staleness}); the trainer "
            "would drop it unseen. Generate it again with current weights")


class Submissions:
    def __init__(self, redis, cfg: BufferRun, model: ModelLimits):
        self.r = redis
        self.cfg = cfg
        self.keys = RunKeys(cfg.run_id)
        self.limits = SubmitLimits(cfg.buffer.group_size, model, cfg.task.reward_range)
        self._append = redis.register_script(SUBMIT_SCRIPT)
        self.accepted = 0
        self.refused = 0
        self.stale = 0
        self.repeated = 0

    def _request_key(self, request: buffer_pb2.SubmitRequest) -> str | None:
        if not request.request_id:
            return None
        if not REQUEST_ID.fullmatch(request.request_id):
            raise CodecError(f"SubmitRequest.request_id: {request.request_id[:140]!r} is not "
                             f"1 to 128 of A-Z a-z 0-9 . _ : -")
        return self.keys.submit_request(request.request_id)

    def _repeat(self, request: buffer_pb2.SubmitRequest, record: bytes, digest: str) -> int:
        """The prompt id a request_id was given, if this request is the same group."""
        prompt_id, first_digest = record.decode().split(" ")
        if first_digest != digest:
            raise CodecError(f"SubmitRequest.request_id: {request.request_id!r} was given to a "
                             f"different group (prompt {prompt_id}) within "
                             f"buffer.submit_dedup_ttl_s; use a new id for each group")
        self.repeated += 1
        return int(prompt_id)

    def submit(self, request: buffer_pb2.SubmitRequest) -> tuple[int, bool]:
        """(prompt id, whether a previous call with this request_id had appended it)."""
        try:
            key = self._request_key(request)
            digest = hashlib.sha256(request.SerializeToString(deterministic=True)).hexdigest()
            if key and (record := self.r.get(key)) is not None:
                return self._repeat(request, record, digest), True
            pipe = self.r.pipeline(transaction=False)
            pipe.get(self.keys.trainer_version).hgetall(self.keys.live_settings)
            version, stored = pipe.execute()
            latest = int(version or 0)
            samples = to_samples(request, self.limits, latest)  # all checks before an id
            max_staleness = control.settings_from_hash(stored, self.cfg.live).max_staleness
            check_fresh(samples, latest, max_staleness)
        except CodecError:
            self.refused += 1
            raise
        except StaleGroup:
            self.stale += 1
            raise
        # an id taken for a group then refused for room is simply never used
        prompt_id = EXTERNAL_PROMPT_BASE + int(self.r.incr(self.keys.external_ids))
        for s in samples:
            s.prompt_id, s.lease_id = prompt_id, f"external:{prompt_id}"
        # never waits: a full buffer or a Redis at its memory limit is the caller's to retry
        entry = encode_group(Group(prompt_id, samples, request.source))
        reply = self._append(keys=[self.keys.trajectories, *([key] if key else [])],
                             args=[self.cfg.buffer.max_pending_samples,
                                   self.cfg.buffer.submit_dedup_ttl_s, f"{prompt_id} {digest}",
                                   len(samples), entry])
        if reply[0] == 0:
            raise BufferFull(int(reply[1]), self.cfg.buffer.max_pending_samples)
        if reply[0] == 2:  # the same request, sent again, went in while this one was checked
            return self._repeat(request, reply[1], digest), True
        self.accepted += 1
        return prompt_id, False
