"""From a decoded Batch to padded tensors, after the staleness filter."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from relayrl.contracts.messages import Batch, Group
from relayrl_torch.models.routing import replayed
from trainer_svc.losses.advantages import group_advantages, is_uniform
from trainer_svc.losses.regularizers import entropy_from_logprobs
from trainer_svc.output_layer import decoder_hidden, output_weight, token_stats


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # [B, L] prompt + response, right-padded
    attention_mask: torch.Tensor  # [B, L]
    response_mask: torch.Tensor  # [B, L-1] float, aligned with next-token predictions
    behaviour_logprobs: torch.Tensor  # [B, L-1]
    token_versions: torch.Tensor  # [B, L-1] version that sampled each response token, else -1
    advantages: torch.Tensor  # [B] GRPO group advantages; the trainer uses its loss's estimator
    rewards: torch.Tensor  # [B] float64: a reward near the float32 limit stays finite
    group_ids: torch.Tensor  # [B] position of the sample's group in the batch
    lags: torch.Tensor  # [B] trainer version minus the sample's oldest token version
    response_lengths: torch.Tensor  # [B]
    prompt_lengths: torch.Tensor  # [B] tokens before the response
    prefix_ids: torch.Tensor  # [B] rows with the same id start with the same prompt tokens
    # [B, L, moe layers, top_k] int16: the experts the engine routed each position to, -1
    # where it recorded none (the router chooses); [B, L, 0, 0] when nothing is replayed
    routes: torch.Tensor

    def to(self, device: torch.device) -> TrainBatch:
        """This batch on `device`: itself when it is there already (collated on the CPU, it
        moves to the trainer's device once per update)."""
        if self.input_ids.device == device:
            return self
        return TrainBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


@dataclass
class Split:
    kept: list[Group]
    stale: list[Group]


def split_stale(batch: Batch, version: int, max_staleness: int) -> Split:
    """A group is stale when its oldest token lags `version` by more than the bound
    (relayrl.rules.staleness.is_stale, the rule Submit refuses by and the simulator drops by)."""
    kept, stale = [], []
    for g in batch.groups:
        (stale if g.is_stale(version, max_staleness) else kept).append(g)
    return Split(kept, stale)


LAG_BUCKETS = 8  # lags above this (but within the bound) share one bucket


def lag_bucket_names(max_staleness: int) -> list[str]:
    exact = [str(k) for k in range(min(max_staleness, LAG_BUCKETS) + 1)]
    wide = [f"{LAG_BUCKETS + 1}plus"] if max_staleness > LAG_BUCKETS else []
    return [f"staleness/samples_lag_{b}" for b in [*exact, *wide, "over"]]


def lag_histogram(batch: Batch, version: int, max_staleness: int) -> dict[str, int]:
    """Samples of the batch per staleness lag (versions between the sample's oldest token and
    `version`): one bucket per lag up to LAG_BUCKETS, one for the rest the bound admits, and
    `over` for those it drops. Every bucket is always present, so a dashboard's series never
    start mid-run."""
    hist = dict.fromkeys(lag_bucket_names(max_staleness), 0)
    for g in batch.groups:
        bucket = _bucket(max(version - g.oldest_version, 0), max_staleness)
        hist[f"staleness/samples_lag_{bucket}"] += len(g.samples)
    return hist


def token_lag_histogram(groups: list[Group], version: int, max_staleness: int
                        ) -> dict[str, int]:
    """As lag_histogram, for the policy's response tokens of `groups`, each by its own lag
    (`version` minus the version that sampled it): staleness per token, where a sample's lag
    is its oldest token's. Names staleness/tokens_lag_<bucket>."""
    hist = {name.replace("samples_lag", "tokens_lag"): 0
            for name in lag_bucket_names(max_staleness)}
    # every lag past the bound is one bucket ("over"): clipped there, the counts stay short
    lags = [np.clip(version - s.versions[s.policy_token_mask], 0, max_staleness + 1)
            for g in groups for s in g.samples]
    counts = np.bincount(np.concatenate(lags).astype(np.int64)) if lags else []
    for lag, n in enumerate(counts):
        if n:
            hist[f"staleness/tokens_lag_{_bucket(lag, max_staleness)}"] += int(n)
    return hist


def _bucket(lag: int, max_staleness: int) -> str:
    if lag > max_staleness:
        return "over"
    return str(lag) if lag <= LAG_BUCKETS else f"{LAG_BUCKETS + 1}plus"


def split_uniform(groups: list[Group]) -> tuple[list[Group], list[Group]]:
    """(groups whose rewards differ, groups whose rewards all agree): the latter carry no
    group-relative signal, and DAPO's dynamic sampling leaves them out of the step. Uniform
    up to float rounding, as the advantage estimators see it (losses.advantages.is_uniform)."""
    varied, uniform = [], []
    for g in groups:
        rewards = torch.tensor([s.reward for s in g.samples], dtype=torch.float64)
        (uniform if is_uniform(rewards) else varied).append(g)
    return varied, uniform


def collate(groups: list[Group], version: int, pad_id: int, scale_rewards: bool,
            replay: bool = False) -> TrainBatch:
    """`replay`: carry the samples' routes (trainer.routing_replay on a mixture of experts;
    a sample without any is routed by the trainer's routers)."""
    samples = [s for g in groups for s in g.samples]
    prompts: dict[bytes, int] = {}
    advantages = torch.cat([
        group_advantages(torch.tensor([s.reward for s in g.samples], dtype=torch.float64),
                         scale_rewards)
        for g in groups
    ]).float()
    width = max(len(s.prompt_tokens) + len(s.response_tokens) for s in samples)
    b = len(samples)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    resp_mask = torch.zeros((b, width - 1))
    behaviour = torch.zeros((b, width - 1))
    versions = torch.full((b, width - 1), -1, dtype=torch.long)
    shapes = {s.routes.shape[::2] for s in samples if s.routes is not None} if replay else ()
    assert len(shapes) <= 1, f"routes of several shapes: {shapes}"  # screened (quarantine)
    layers, top_k = next(iter(shapes), (0, 0))
    routes = torch.full((b, width, layers, top_k), -1, dtype=torch.int16)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_tokens), len(s.response_tokens)
        ids[i, :p] = torch.from_numpy(s.prompt_tokens.astype("int64"))
        ids[i, p:p + r] = torch.from_numpy(s.response_tokens.astype("int64"))
        attn[i, :p + r] = 1
        # logits at position t predict token t+1: response token j sits at p+j, predicted at p+j-1
        resp_mask[i, p - 1:p - 1 + r] = torch.from_numpy(s.policy_token_mask.astype("float32"))
        behaviour[i, p - 1:p - 1 + r] = torch.from_numpy(s.logprobs.copy())
        versions[i, p - 1:p - 1 + r] = torch.from_numpy(s.versions.astype("int64"))
        if layers and s.routes is not None:  # every position but the last: [P+R-1, ...]
            routes[i, :p + r - 1] = torch.from_numpy(s.routes.astype("int16")).transpose(0, 1)
    return TrainBatch(
        input_ids=ids, attention_mask=attn, response_mask=resp_mask,
        behaviour_logprobs=behaviour, token_versions=versions, advantages=advantages,
        rewards=torch.tensor([s.reward for s in samples], dtype=torch.float64),
        group_ids=torch.tensor([i for i, g in enumerate(groups) for _ in g.samples]),
        lags=torch.tensor([version - s.oldest_version for s in samples]),
        # the policy's tokens: a multi-turn response's environment tokens are not its length
        response_lengths=torch.tensor([int(s.policy_token_mask.sum()) for s in samples]),
        prompt_lengths=torch.tensor([len(s.prompt_tokens) for s in samples]),
        prefix_ids=torch.tensor([prompts.setdefault(s.prompt_tokens.tobytes(), len(prompts))
                                 for s in samples]),
        routes=routes,
    )


@dataclass
class PolicyOutputs:
    logprobs: torch.Tensor  # [B, L-1] log pi of each next token
    entropy: torch.Tensor  # [B, L-1] entropy of each next-token distribution
    hidden: torch.Tensor | None  # [B, L-1, H] last hidden state, when asked for


def policy_outputs(model, batch: TrainBatch, temperature: float, *, entropy_grad: bool = False,
                   hidden: bool = False) -> PolicyOutputs:
    """One forward pass: next-token log-probabilities, the entropy of each next-token
    distribution (with a gradient only if `entropy_grad`), and optionally the last hidden
    state on the same positions."""
    weight = output_weight(model, batch.input_ids.numel())
    if weight is not None:  # the output layer a chunk of positions at a time
        with replayed(model, batch.routes):
            h, _ = decoder_hidden(model, input_ids=batch.input_ids,
                                  attention_mask=batch.attention_mask)
        h = h[:, :-1]
        logprobs, entropy = token_stats(h, weight, batch.input_ids[:, 1:], temperature,
                                        entropy_grad)
        return PolicyOutputs(logprobs=logprobs, entropy=entropy, hidden=h if hidden else None)
    with replayed(model, batch.routes):
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    output_hidden_states=hidden)
    logprobs, entropy = next_token_stats(out.logits[:, :-1], batch.input_ids[:, 1:],
                                         temperature, entropy_grad)
    return PolicyOutputs(
        logprobs=logprobs, entropy=entropy,
        hidden=out.hidden_states[-1][:, :-1] if hidden else None,
    )


# Positions whose entropy is computed at once when it needs no gradient: a [n, V] float32
# temporary in place of a whole pass's [tokens, V] (one chunk of 1024 is 192 MiB at
# SmolLM2's vocabulary of 49,152).
ENTROPY_CHUNK_TOKENS = 1024


def next_token_stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                     entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, T] log pi of each target, [B, T] entropy of each distribution) from [B, T, V]
    logits. For a large vocabulary a pass's [T, V] tensors are what bound its memory, so
    beside the log-softmax the backward keeps, no other is made: no copy for a temperature
    of 1, and an entropy without a gradient is taken a few positions at a time."""
    logits = logits.float()  # no copy for float32 logits
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    taken = logp.gather(-1, targets[..., None]).squeeze(-1)
    if entropy_grad and torch.is_grad_enabled():
        return taken, entropy_from_logprobs(logp)
    with torch.no_grad():
        entropy = torch.empty(logp.shape[:-1], dtype=logp.dtype, device=logp.device)
        step = max(1, ENTROPY_CHUNK_TOKENS // max(logp.shape[0], 1))
        for s in range(0, logp.shape[1], step):
            entropy[:, s:s + step] = entropy_from_logprobs(logp[:, s:s + step])
    return taken, entropy


def token_logprobs(model, batch: TrainBatch, temperature: float) -> torch.Tensor:
    """log pi(token_{t+1} | tokens_<=t) for every position, [B, L-1]."""
    return policy_outputs(model, batch, temperature).logprobs


def select_rows(tb: TrainBatch, rows: torch.Tensor, device: torch.device) -> TrainBatch:
    """The batch's rows `rows` (every field is per row), on `device`."""
    return TrainBatch(**{f.name: getattr(tb, f.name)[rows].to(device) for f in fields(tb)})
