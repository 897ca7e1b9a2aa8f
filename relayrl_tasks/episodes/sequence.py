"""An episode laid out as one token sequence, and its policy-token mask: 1 for each token the
model sampled, 0 for each its environment's turn put between two of the model's (the
template's glue around an observation, relayrl_tasks/episodes/turns.py). The writer
(PolicyMask, which the rollout worker's and the evaluator's episodes grow turn by turn) and
the reader (episode_counts, a trained step's episodes and turns) sit together here, so the
mask is read as it was written.

    mask = PolicyMask()
    mask.add_model(len(reply_tokens)); mask.add_env(len(glue)); mask.add_model(...)
    mask.policy_tokens, mask.env_tokens   # what the episode's budgets count
    Sample(..., loss_mask=mask.loss_mask())

A sample carries the mask as `loss_mask` (the trainer leaves the environment's tokens out of
the loss), or none when every token is the model's: one turn, as a sample without an
environment has.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from relayrl.contracts.messages import Sample


class PolicyMask:
    """The policy-token mask of an episode's response, as its turns append to it."""

    def __init__(self) -> None:
        self.values: list[int] = []
        self.policy_tokens = 0  # the model's tokens over all its turns

    def __len__(self) -> int:
        return len(self.values)

    @property
    def env_tokens(self) -> int:
        """The environment's tokens the response holds."""
        return len(self.values) - self.policy_tokens

    def add_model(self, n: int) -> None:
        """A model turn of `n` tokens."""
        self.values += [1] * n
        self.policy_tokens += n

    def add_env(self, n: int) -> None:
        """`n` environment tokens after a model turn."""
        self.values += [0] * n

    def loss_mask(self) -> list[int] | None:
        """The mask as a sample carries it: None when every token is the model's."""
        return self.values if self.env_tokens else None


def episode_counts(samples: Sequence[Sample]) -> tuple[int, int]:
    """(episodes, model turns): each sample of an environment run is one episode, and each
    run of the policy's tokens in its response one turn."""
    turns = 0
    for s in samples:
        mask = s.policy_token_mask
        if mask.size:  # a turn starts wherever a policy token follows a non-policy one
            turns += int(mask[0]) + int(np.count_nonzero(mask[1:] & ~mask[:-1]))
    return len(samples), turns
