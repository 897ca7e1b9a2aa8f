"""From a decoded Batch to padded tensors, after the staleness filter."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relayrl.messages import Batch, Group
from trainer_svc.losses import group_advantages


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # [B, L] prompt + response, right-padded
    attention_mask: torch.Tensor  # [B, L]
    response_mask: torch.Tensor  # [B, L-1] float, aligned with next-token predictions
    behaviour_logprobs: torch.Tensor  # [B, L-1]
    token_versions: torch.Tensor  # [B, L-1] version that sampled each response token, else -1
    advantages: torch.Tensor  # [B]
    rewards: torch.Tensor  # [B]
    lags: torch.Tensor  # [B] trainer version minus the sample's oldest token version
    response_lengths: torch.Tensor  # [B]


@dataclass
class Split:
    kept: list[Group]
    stale: list[Group]


def split_stale(batch: Batch, version: int, max_staleness: int) -> Split:
    """A group is stale when its oldest token lags `version` by more than the bound."""
    kept, stale = [], []
    for g in batch.groups:
        (stale if version - g.oldest_version > max_staleness else kept).append(g)
    return Split(kept, stale)


def collate(groups: list[Group], version: int, pad_id: int, scale_rewards: bool) -> TrainBatch:
    samples = [s for g in groups for s in g.samples]
    advantages = torch.cat([
        group_advantages(torch.tensor([s.reward for s in g.samples], dtype=torch.float32),
                         scale_rewards)
        for g in groups
    ])
    width = max(len(s.prompt_tokens) + len(s.response_tokens) for s in samples)
    b = len(samples)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    resp_mask = torch.zeros((b, width - 1))
    behaviour = torch.zeros((b, width - 1))
    versions = torch.full((b, width - 1), -1, dtype=torch.long)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_tokens), len(s.response_tokens)
        ids[i, :p] = torch.from_numpy(s.prompt_tokens.astype("int64"))
        ids[i, p:p + r] = torch.from_numpy(s.response_tokens.astype("int64"))
        attn[i, :p + r] = 1
        # logits at position t predict token t+1: response token j sits at p+j, predicted at p+j-1
        resp_mask[i, p - 1:p - 1 + r] = torch.from_numpy(s.policy_token_mask.astype("float32"))
        behaviour[i, p - 1:p - 1 + r] = torch.from_numpy(s.logprobs.copy())
        versions[i, p - 1:p - 1 + r] = torch.from_numpy(s.versions.astype("int64"))
    return TrainBatch(
        input_ids=ids, attention_mask=attn, response_mask=resp_mask,
        behaviour_logprobs=behaviour, token_versions=versions, advantages=advantages,
        rewards=torch.tensor([s.reward for s in samples]),
        lags=torch.tensor([version - s.oldest_version for s in samples]),
        response_lengths=torch.tensor([len(s.response_tokens) for s in samples]),
    )


def token_logprobs(model, batch: TrainBatch, temperature: float) -> torch.Tensor:
    """log pi(token_{t+1} | tokens_<=t) for every position, [B, L-1]."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    return logp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
