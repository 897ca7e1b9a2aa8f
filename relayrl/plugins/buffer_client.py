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


class TurnSequence:
    """A conversation's turns laid out as one training sequence as they come: the first
    turn's prompt, then each turn's completion (the policy's tokens) and the tokens between it
    and the next turn's completion (the tool results and the template's, masked from the loss,
    with the version of the turn before them). Holds each token once, whatever the turns."""

    def __init__(self) -> None:
        self.prompt: list[int] | None = None
        self.response: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.mask: list[int] = []
        self.turns = 0

    @property
    def tokens(self) -> list[int]:
        """The whole sequence so far, which the next turn's prompt must extend."""
        return [*(self.prompt or ()), *self.response]

    def extends(self, prompt_token_ids: Sequence[int]) -> bool:
        """Whether a turn's prompt extends the sequence so far exactly."""
        seen = self.tokens
        return list(prompt_token_ids[:len(seen)]) == seen

    def add(self, t: ChatTurn) -> None:
        """ValueError when the turn's lengths differ, or its prompt does not extend the turns
        before it exactly (the server renders every assistant turn it returned as its own
        tokens; a turn the agent rewrote, or one the server no longer remembers, breaks it)."""
        n = self.turns
        if not len(t.token_ids) == len(t.logprobs) == len(t.policy_versions):
            raise ValueError(f"turns[{n}]: token_ids, logprobs and policy_versions differ in "
                             "length")
        if self.prompt is None:
            self.prompt = list(t.prompt_token_ids)
        elif not self.extends(t.prompt_token_ids):
            raise ValueError(f"turns[{n}].prompt_token_ids: does not extend the turn before "
                             "it (was an assistant message changed before it was sent back?)")
        between = list(t.prompt_token_ids[len(self.prompt) + len(self.response):])
        before = self.versions[-1] if self.versions else min(t.policy_versions, default=0)
        self.response += between + list(t.token_ids)
        self.logprobs += [0.0] * len(between) + list(t.logprobs)
        self.versions += [before] * len(between) + list(t.policy_versions)
        self.mask += [0] * len(between) + [1] * len(t.token_ids)
        self.turns += 1

    def trajectory(self, reward: float, finish_reason: str = "stop") -> buffer_pb2.Trajectory:
        """The sequence as one trajectory for Buffer.Submit, rewarded `reward`."""
        if self.prompt is None:
            raise ValueError("turns: a trajectory needs at least one turn")
        return buffer_pb2.Trajectory(
            prompt_tokens=self.prompt, response_tokens=self.response, logprobs=self.logprobs,
            versions=self.versions, loss_mask=self.mask, reward=reward,
            finish_reason=finish_reason)


def trajectory_from_turns(turns: Sequence[ChatTurn], reward: float,
                          finish_reason: str = "stop") -> buffer_pb2.Trajectory:
    """One trajectory of a conversation's turns, laid out by TurnSequence; ValueError when
    a turn's prompt does not extend the turn before it exactly."""
    seq = TurnSequence()
    for t in turns:
        seq.add(t)
    return seq.trajectory(reward, finish_reason)
