"""Submitting a group to the buffer from an agent, safe to retry.

Each group gets one request_id, kept across every attempt: when a reply is lost (the call
timed out, the connection dropped) the retry is recognised by the buffer and answered with
the first call's prompt id instead of appending the group a second time.
"""

from __future__ import annotations

import random
import time
import uuid

import grpc

from relayrl.contracts.proto.v1 import buffer_pb2
from relayrl.runtime.backpressure import Backoff

# Worth the same request again: the buffer or its Redis was unreachable or slow (the group
# may or may not have gone in), or the buffer was full (it did not).
RETRIED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                     grpc.StatusCode.RESOURCE_EXHAUSTED})


def submit_group(stub, trajectories: list[buffer_pb2.Trajectory], *, source: str = "",
                 metadata=(), timeout_s: float = 30.0, attempts: int = 8,
                 request_id: str | None = None) -> buffer_pb2.SubmitResponse:
    """Buffer.Submit of one group, retried with capped, jittered backoff on RETRIED codes;
    any other refusal (INVALID_ARGUMENT, FAILED_PRECONDITION, ...) is raised at once."""
    if attempts < 1:
        raise ValueError(f"attempts: must be >= 1, got {attempts}")
    request = buffer_pb2.SubmitRequest(trajectories=trajectories, source=source,
                                       request_id=request_id or uuid.uuid4().hex)
    backoff = Backoff(first_s=0.25, max_s=8.0)
    for attempt in range(attempts):
        try:
            return stub.Submit(request, metadata=metadata, timeout=timeout_s)
        except grpc.RpcError as err:
            if err.code() not in RETRIED or attempt == attempts - 1:
                raise
            time.sleep(backoff.next_delay() * random.uniform(0.5, 1.0))
    raise AssertionError("unreachable")
