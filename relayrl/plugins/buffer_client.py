"""Submitting a group to the buffer from an agent, safe to retry; and making one
trajectory of a multi-turn conversation played through a worker's OpenAI-compatible server.

Each group gets one request_id, kept across every attempt: when a reply is lost (the call
timed out, the connection dropped) the retry is recognised by the buffer and answered with
the first call's prompt id instead of appending the group a second time.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Sequence
from typing import NamedTuple

import grpc

from relayrl.contracts.proto.v1 import buffer_pb2
from relayrl.runtime.backpressure import Backoff
from relayrl.runtime.outage import is_too_large

# Worth the same request again: the buffer or its Redis was unreachable or slow (the group
# may or may not have gone in), or the buffer was full or busy (it did not); not a group over
# the buffer's message size limit (relayrl.runtime.outage.is_too_large).
RETRIED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                     grpc.StatusCode.RESOURCE_EXHAUSTED})


def buffer_channel(address: str, ca: str | None = None) -> grpc.Channel:
    """A channel to the buffer at `address`: TLS verified against the PEM file `ca` (the
    run's auth.tls.ca) when given, else plaintext (a run on loopback)."""
    if ca is None:
        return grpc.insecure_channel(address)
    with open(ca, "rb") as f:
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(f.read()))


def submit_group(stub, trajectories: list[buffer_pb2.Trajectory], *, source: str = "",
                 metadata=(), timeout_s: float = 30.0, attempts: int = 8,
                 request_id: str | None = None) -> buffer_pb2.SubmitResponse:
    """Buffer.Submit of one group, retried with capped, jittered backoff on RETRIED codes;
    any other refusal (INVALID_ARGUMENT, FAILED_PRECONDITION, a group too large, ...) is
    raised at once."""
    if attempts < 1:
        raise ValueError(f"attempts: must be >= 1, got {attempts}")
    request = buffer_pb2.SubmitRequest(trajectories=trajectories, source=source,
                                       request_id=request_id or uuid.uuid4().hex)
    backoff = Backoff(first_s=0.25, max_s=8.0)
    for attempt in range(attempts):
        try:
            return stub.Submit(request, metadata=metadata, timeout=timeout_s)
        except grpc.RpcError as err:
            if err.code() not in RETRIED or is_too_large(err) or attempt == attempts - 1:
                raise
            time.sleep(backoff.next_delay() * random.uniform(0.5, 1.0))
    raise AssertionError("unreachable")


class ChatTurn(NamedTuple):
    """One chat completion of a conversation, as the server reported it: the response's
    `prompt_token_ids`, and the choice's `token_ids`, log-probabilities and
    `policy_versions`."""
    prompt_token_ids: Sequence[int]
    token_ids: Sequence[int]
    logprobs: Sequence[float]
    policy_versions: Sequence[int]


def trajectory_from_turns(turns: Sequence[ChatTurn], reward: float,
                          finish_reason: str = "stop") -> buffer_pb2.Trajectory:
    """One trajectory of a conversation's turns: the first turn's prompt, then each turn's
    completion (the policy's tokens) and the tokens between it and the next turn's
    completion (the tool results and the template's, masked from the loss, with the version
    of the turn before them). ValueError when a turn's prompt does not extend the turn
    before it exactly (the server renders every assistant turn it returned as its own
    tokens; a turn the agent rewrote, or one the server no longer remembers, breaks it)."""
    if not turns:
        raise ValueError("turns: a trajectory needs at least one turn")
    first = list(turns[0].prompt_token_ids)
    seq, logprobs, versions, mask = list(first), [], [], []
    for n, t in enumerate(turns):
        if not len(t.token_ids) == len(t.logprobs) == len(t.policy_versions):
            raise ValueError(f"turns[{n}]: token_ids, logprobs and policy_versions differ in "
                             "length")
        prompt = list(t.prompt_token_ids)
        if prompt[:len(seq)] != seq:
            raise ValueError(f"turns[{n}].prompt_token_ids: does not extend the turn before "
                             "it (was an assistant message changed before it was sent back?)")
        between = prompt[len(seq):]
        seq += between + list(t.token_ids)
        logprobs += [0.0] * len(between) + list(t.logprobs)
        before = versions[-1] if versions else min(t.policy_versions, default=0)
        versions += [before] * len(between) + list(t.policy_versions)
        mask += [0] * len(between) + [1] * len(t.token_ids)
    return buffer_pb2.Trajectory(
        prompt_tokens=first, response_tokens=seq[len(first):], logprobs=logprobs,
        versions=versions, loss_mask=mask, reward=reward, finish_reason=finish_reason)
