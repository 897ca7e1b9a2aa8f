"""Put any Python scoring function (a reward model, a sandbox, a judge) behind the Reward
gRPC service, for RemoteReward ("remote:HOST:PORT") to call.

    server = serve_reward_model(my_model_score, "127.0.0.1:50570")
    server.wait_for_termination()
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import grpc

from relayrl.contracts.proto.v1 import reward_pb2, reward_pb2_grpc
from relayrl.runtime.auth import reward_credentials
from relayrl.runtime.grpc_util import make_server
from relayrl_tasks.rewards.scoring import score

log = logging.getLogger(__name__)

ItemScorer = Callable[[str, str, str], float]
"""(prompt, completion, reference) -> reward."""

DEFAULT_MAX_BATCH = 4096


class RewardServicer(reward_pb2_grpc.RewardServicer):
    """Scores item by item: one item raising reports that item's error, the rest still score."""

    def __init__(self, fn: ItemScorer, max_batch: int = DEFAULT_MAX_BATCH):
        if not callable(fn):
            raise ValueError(f"reward server: fn must be callable, got {fn!r}")
        if max_batch < 1:
            raise ValueError(f"reward server: max_batch must be >= 1, got {max_batch}")
        self.fn = fn
        self.max_batch = max_batch

    def Score(self, request, context):
        """Score a batch of completions with the served reward; refuses (INVALID_ARGUMENT)
        a batch over `max_batch` or whose lists do not line up."""
        n = len(request.completions)
        if n > self.max_batch:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"Score: completions holds {n} items, over the limit of "
                          f"{self.max_batch}")
        for field in ("prompts", "references"):
            got = len(getattr(request, field))
            if got not in (0, n):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"Score: {field} holds {got} items but completions holds {n}; "
                              f"send {n} or none")
        prompts = list(request.prompts) or [""] * n
        references = list(request.references) or [""] * n
        results = [score(functools.partial(self.fn, p), c, r)
                   for p, c, r in zip(prompts, request.completions, references, strict=True)]
        failed = [err for _, err in results if err]
        if failed:
            log.warning("Score: %d of %d items failed; first: %s", len(failed), n, failed[0])
        return reward_pb2.ScoreResponse(rewards=[r for r, _ in results],
                                        errors=[e for _, e in results])


def serve_reward_model(fn: ItemScorer, address: str, *, max_batch: int = DEFAULT_MAX_BATCH,
                       max_workers: int = 4) -> grpc.Server:
    """Start a Reward server (with the standard health service) for `fn` on `address` and
    return it running; stop it with server.stop(grace). It takes the reward token alone
    ($RELAYRL_REWARD_TOKEN; open when unset), which is what RemoteReward sends."""
    server, _ = make_server(address, [(reward_pb2_grpc.add_RewardServicer_to_server,
                                       RewardServicer(fn, max_batch))], max_workers=max_workers,
                            credentials=reward_credentials())
    server.start()
    log.info("reward server for %s listening on %s", getattr(fn, "__name__", fn), address)
    return server
