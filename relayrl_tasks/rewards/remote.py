"""A reward computed by a Reward gRPC server (a reward model, a sandbox, a judge).

RemoteReward is a reward function like any other: config specs name it as
"remote:HOST:PORT". Its failures (server down, deadline passed, malformed answer, an error
reported for the item) raise RemoteRewardError, which score() records on the sample.
score_group() sends a group's completions in one request. The record's metadata does not
travel: the Reward service carries prompts, completions and references only. A reward
server is no part of the run: the channel carries the reward token ($RELAYRL_REWARD_TOKEN,
auth.reward_token_env) and the run's TLS verification, never a token of the run
(relayrl.runtime.auth.reward_credentials).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from relayrl.contracts.proto.v1 import reward_pb2, reward_pb2_grpc
from relayrl.runtime.auth import reward_credentials
from relayrl.runtime.deadlines import REWARD_CALL_S
from relayrl.runtime.grpc_util import channel
from relayrl_tasks.rewards.calling import Prompt

DEFAULT_TIMEOUT_S = REWARD_CALL_S


class RemoteRewardError(RuntimeError):
    """A remote reward server gave no reward for a completion."""
    pass


def check_address(address: str) -> str:
    """`address` as HOST:PORT; ValueError otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"remote reward address {address!r} must be HOST:PORT "
                         "with a port in 1..65535")
    return address


class RemoteReward:
    """Rewards computed by a server speaking the Reward gRPC service (`remote:HOST:PORT`)."""
    def __init__(self, address: str, timeout_s: float = DEFAULT_TIMEOUT_S):
        if not isinstance(timeout_s, int | float) or not timeout_s > 0:
            raise ValueError(f"remote reward timeout_s must be > 0, got {timeout_s!r}")
        self.address = check_address(address)
        self.timeout_s = float(timeout_s)
        self.name = f"remote:{address}"
        self._channel = channel(address, reward_credentials())
        self._stub = reward_pb2_grpc.RewardStub(self._channel)

    def __call__(self, completion: str, reference: str) -> float:
        ((reward, error),) = self.score_batch([completion], [reference])
        if error:
            raise RemoteRewardError(f"{self.name}: {error}")
        return reward

    def group_scores(self, completions: Sequence[str], reference: str,
                     metadata: Mapping | None = None, prompt: Prompt = "",
                     **_: Any) -> list[tuple[float, str]]:
        """One request for a group (see relayrl_tasks.rewards.calling), with the prompt:
        its text, or its chat messages as JSON. Metadata and conversations are not sent."""
        text = prompt if isinstance(prompt, str) else json.dumps([dict(m) for m in prompt])
        n = len(completions)
        return [(0.0, f"RemoteRewardError: {self.name}: {error}") if error else (reward, "")
                for reward, error in self.score_batch(completions, [reference] * n,
                                                      [text] * n if text else [])]

    def score_batch(self, completions: Sequence[str], references: Sequence[str] = (),
                    prompts: Sequence[str] = ()) -> list[tuple[float, str]]:
        """(reward, error) per completion, in order; an item's error leaves the rest scored.
        `references` and `prompts` are each empty or as long as `completions`."""
        request = reward_pb2.ScoreRequest(
            completions=completions, references=references, prompts=prompts)
        try:
            response = self._stub.Score(request, timeout=self.timeout_s)
        except grpc.RpcError as err:
            raise RemoteRewardError(f"{self.name}: {err.code().name}: {err.details()}") from None
        return self._check(response, len(completions))

    def _check(self, response: reward_pb2.ScoreResponse, n: int) -> list[tuple[float, str]]:
        rewards, errors = list(response.rewards), list(response.errors)
        if len(rewards) != n or len(errors) != n:
            raise RemoteRewardError(f"{self.name}: bad response: {len(rewards)} rewards and "
                                    f"{len(errors)} errors for {n} items")
        for i, (reward, error) in enumerate(zip(rewards, errors, strict=True)):
            if not error and not math.isfinite(reward):
                raise RemoteRewardError(f"{self.name}: bad response: rewards[{i}] is {reward}")
        return [(0.0, e) if e else (r, "") for r, e in zip(rewards, errors, strict=True)]

    def close(self) -> None:
        """Close the channel to the reward server."""
        self._channel.close()

    def __enter__(self) -> RemoteReward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteReward({self.address!r}, timeout_s={self.timeout_s:g})"
