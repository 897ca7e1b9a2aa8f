"""Externally produced groups (custom rollouts) into the trajectory stream.

A submitted group is checked whole before anything is written, given a prompt id from the
external range, and appended in one transaction, so the buffer assembles and batches it on
the same exactly-once path as the workers' samples.
"""

from __future__ import annotations

import numpy as np

from relayrl.codec import CodecError
from relayrl.keys import EXTERNAL_PROMPT_BASE, RunKeys
from relayrl.messages import Sample
from relayrl.proto.v1 import buffer_pb2
from relayrl.streams import TrajectoryWriter

MAX_TOKENS = 1 << 20


def to_samples(request: buffer_pb2.SubmitRequest, group_size: int, latest_version: int,
               prompt_id: int = EXTERNAL_PROMPT_BASE) -> list[Sample]:
    """The group as samples, or a CodecError that names the field."""
    trajs = request.trajectories
    if len(trajs) != group_size:
        raise CodecError(f"SubmitRequest.trajectories: {len(trajs)} given, a group is "
                         f"buffer.group_size ({group_size})")
    samples = []
    for i, t in enumerate(trajs):
        where = f"SubmitRequest.trajectories[{i}]"
        n = len(t.response_token_ids)
        if len(t.prompt_token_ids) + n > MAX_TOKENS:
            raise CodecError(f"{where}: more than {MAX_TOKENS} tokens")
        if t.versions and max(t.versions) > latest_version:
            raise CodecError(f"{where}.versions: version {max(t.versions)} is newer than the "
                             f"latest policy version ({latest_version})")
        mask = np.asarray(t.loss_mask, dtype=np.int64) if len(t.loss_mask) else None
        if mask is not None and np.any((mask != 0) & (mask != 1)):
            raise CodecError(f"{where}.loss_mask: values must be 0 or 1")
        try:
            samples.append(Sample(
                prompt_id=prompt_id, lease_id=f"external:{prompt_id}",
                worker_id=request.source or "external",
                prompt_tokens=list(t.prompt_token_ids), response_tokens=list(t.response_token_ids),
                logprobs=list(t.logprobs), versions=list(t.versions), reward=t.reward,
                finish_reason=t.finish_reason or "stop",
                loss_mask=None if mask is None else mask.astype(np.uint8)))
        except CodecError as err:
            raise CodecError(f"{where}.{str(err).removeprefix('sample.')}") from None
    return samples


class Submissions:
    def __init__(self, redis, keys: RunKeys, group_size: int, max_pending: int):
        self.r = redis
        self.keys = keys
        self.group_size = group_size
        self.writer = TrajectoryWriter(redis, keys, max_pending)
        self.accepted = 0
        self.refused = 0

    def submit(self, request: buffer_pb2.SubmitRequest) -> int:
        latest = int(self.r.get(self.keys.trainer_version) or 0)
        try:
            to_samples(request, self.group_size, latest)  # all checks before an id is taken
        except CodecError:
            self.refused += 1
            raise
        prompt_id = EXTERNAL_PROMPT_BASE + int(self.r.incr(self.keys.external_ids))
        # never waits: a full buffer or a Redis at its memory limit is the caller's to retry
        # (an id taken for a refused group is simply never used)
        self.writer.try_append(to_samples(request, self.group_size, latest, prompt_id))
        self.accepted += 1
        return prompt_id
