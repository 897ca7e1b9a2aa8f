"""A group whose samples are multi-turn episodes, and the samples it delivers.

Each sample of the group plays its own episode against its own environment instance
(relayrl.plugins.envs.protocol). Its response is one token sequence: the model's tokens of every
turn as sampled, with their log-probabilities and versions, and between turns the environment's
tokens (the chat template's glue around the observation, relayrl_tasks.episodes.turns), which
carry loss_mask 0 (relayrl_tasks.episodes.sequence), log-probability 0 and the version of the
turn before them: values the trainer never reads, under the mask.

A group's samples are rewarded by the episode rule (relayrl_tasks.episodes.reward): the sum
of the environment's rewards, else the task's reward on the model's final message, 0 with the
error on an environment that failed (counted in train/reward_errors, like a reward that
raises).

rollout_svc.episode_generator runs the turns; rollout_svc.boundary delivers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from relayrl.contracts.leases import LeasedPrompt
from relayrl.contracts.messages import FinishReason, Sample
from relayrl.contracts.partial import PartialSequence
from relayrl.plugins.envs import Environment
from relayrl.plugins.envs.calls import Handle, Refused
from relayrl.plugins.rewards import RewardFn
from relayrl_tasks.episodes.play import Turn
from relayrl_tasks.episodes.reward import episode_rewards
from relayrl_tasks.episodes.sequence import PolicyMask


@dataclass
class PendingStep:
    """The environment's step on the model's last reply, running on a thread."""
    turn: Turn
    started: Handle | Refused
    version: int  # of the weights the reply was sampled under


@dataclass
class Episode:
    env: Environment | None  # None: its reset failed (`error` says why); one turn, scored 0
    messages: list[dict[str, str]]  # the conversation so far, as the template renders it
    prompt_tokens: list[int]
    seq: PartialSequence = field(default_factory=PartialSequence)
    mask: PolicyMask = field(default_factory=PolicyMask)
    rewards: list[float] = field(default_factory=list)  # what the environment's steps returned
    turns: int = 0
    last_reply: str = ""  # the model's final message, for the task's reward
    error: str = ""
    step: PendingStep | None = None  # its environment is answering the model's last turn

    @property
    def finished(self) -> bool:
        return self.seq.finished

    @property
    def ready(self) -> bool:
        """Whether the model takes the episode's next turn: it goes on, and is not waiting
        for its environment."""
        return not self.finished and self.step is None

    @property
    def context(self) -> list[int]:
        return self.prompt_tokens + self.seq.tokens

    @property
    def policy_tokens(self) -> int:
        return self.mask.policy_tokens

    def add_model_turn(self, tokens: list[int], logprobs: list[float], version: int,
                       routes: np.ndarray | None = None) -> None:
        self.seq.extend(tokens, logprobs, version, routes)
        self.mask.add_model(len(tokens))
        self.turns += 1

    def add_env_tokens(self, tokens: list[int], version: int) -> None:
        # the environment's tokens are fed by the next turn's call, which routes them all
        self.seq.extend(tokens, [0.0] * len(tokens), version, self.seq.routes)
        self.mask.add_env(len(tokens))

    def end(self, reason: str, error: str = "") -> None:
        self.seq.finish_reason = FinishReason(reason)
        self.error = self.error or error


class EpisodeGroup:
    """What the segment boundary holds for a lease in place of a PartialGroup."""

    def __init__(self, lease: LeasedPrompt, episodes: list[Episode]):
        self.lease = lease
        self.prompt_id = lease.prompt_id
        self.episodes = episodes

    @property
    def prompt_tokens(self) -> list[int]:
        return self.episodes[0].prompt_tokens

    @property
    def sequences(self) -> list[PartialSequence]:
        return [e.seq for e in self.episodes]

    @property
    def finished(self) -> bool:
        return all(e.finished for e in self.episodes)

    def unfinished(self) -> list[PartialSequence]:
        return [e.seq for e in self.episodes if not e.finished]

    def encode(self) -> bytes:
        """No state to hand back: an environment lives in this process, so a lease handed
        back mid-episode starts over wherever it goes next."""
        return b""


def episode_samples(lease: LeasedPrompt, group: EpisodeGroup, worker_id: str,
                    reward_fn: RewardFn, reward_range: tuple[float, float] | None
                    ) -> list[Sample]:
    """The group's samples, rewarded by the episode rule."""
    scores = episode_rewards(group.episodes, reward_fn, lease.reference, lease.metadata,
                             reward_range, prompt=lease.messages or lease.text)
    return [Sample(
        prompt_id=lease.prompt_id, lease_id=lease.lease_id, worker_id=worker_id,
        prompt_tokens=e.prompt_tokens, response_tokens=e.seq.tokens, logprobs=e.seq.logprobs,
        versions=e.seq.versions, reward=reward, finish_reason=e.seq.finish_reason,
        reward_error=error, loss_mask=e.mask.loss_mask(), routes=_covering(e))
        for e, (reward, error) in zip(group.episodes, scores, strict=True)]


def _covering(e: Episode) -> np.ndarray | None:
    """The episode's routes when they cover its every fed position: not when it ends on the
    environment's tokens, which no call fed."""
    routes = e.seq.routes
    fed = len(e.prompt_tokens) + len(e.seq.tokens) - 1
    return routes if routes is not None and routes.shape[1] == fed else None
