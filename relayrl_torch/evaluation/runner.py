"""Evaluating a policy on held-out sets: pass@1 and pass@k from sampled answers, greedy
accuracy, and the mean response length, as one metrics record.

    record = evaluate_sets(lm, build_sets(cfg), seed=0)
    # {"eval/heldout/pass@1": 0.41, "eval/heldout/pass@8": 0.77, ...,
    #  "eval/accuracy_sampled": 0.41, "eval/accuracy_greedy": 0.45}

pass@k is the unbiased estimator of Chen et al. 2021 (HumanEval): with n answers sampled for
a problem of which c are solved, pass@k = 1 - C(n-c, k) / C(n, k), averaged over problems.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from relayrl_tasks.rewards import score
from relayrl_torch.evaluation.episodes import play
from relayrl_torch.evaluation.sets import EvalSet
from relayrl_torch.models.loading import LoadedModel
from relayrl_torch.sampling.sampler import sample


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k answers drawn without replacement from n sampled
    answers, c of them solved, is solved."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class SetResult:
    name: str
    problems: int
    samples: int  # k
    pass_at_1: float
    pass_at_k: float | None  # None when k == 1
    reward_mean: float  # mean sampled reward
    accuracy_greedy: float | None  # None when the set decodes no greedy answer
    response_len_mean: float  # tokens of the sampled answers

    def record(self, default: bool = False) -> dict[str, float]:
        pre = f"eval/{self.name}"
        out = {f"{pre}/pass@1": self.pass_at_1, f"{pre}/response_len_mean":
               self.response_len_mean, f"{pre}/reward_mean": self.reward_mean}
        if self.pass_at_k is not None:
            out[f"{pre}/pass@{self.samples}"] = self.pass_at_k
        if self.accuracy_greedy is not None:
            out[f"{pre}/accuracy_greedy"] = self.accuracy_greedy
        if default:  # the keys every run has written since the first eval
            out["eval/accuracy_sampled"] = self.reward_mean
            if self.accuracy_greedy is not None:
                out["eval/accuracy_greedy"] = self.accuracy_greedy
        return out


class Progress:
    """Where an evaluation is: `done` of `total` sequences decoded; `on_update(done, total)`
    hears each batch (a progress bar's update)."""

    def __init__(self, total: int, on_update: Callable[[int, int], None] | None = None,
                 stop: threading.Event | None = None):
        self.total, self.done = total, 0
        self.on_update = on_update
        self.stop = stop  # set: the decoding raises Stopped between two tokens

    def advance(self, n: int) -> None:
        self.done += n
        if self.on_update is not None:
            self.on_update(self.done, self.total)


def sequences(sets: list[EvalSet]) -> int:
    """How many sequences an evaluation of `sets` decodes: each problem's samples, and its
    greedy answer where the set has one."""
    return sum(len(es.problems) * (es.samples + es.greedy) for es in sets)


@torch.no_grad()
def evaluate_set(lm: LoadedModel, es: EvalSet, *, seed: int = 0,
                 batch_size: int = 256, progress: Progress | None = None) -> SetResult:
    was_training = lm.model.training
    lm.model.eval()
    try:
        gen = torch.Generator().manual_seed(seed)
        prompts = ([] if es.environment is not None  # episodes open through the environment
                   else [lm.encode_problem(p.text, p.messages) for p in es.problems])
        rows = [i for i in range(len(es.problems)) for _ in range(es.samples)]
        progress = progress or Progress(len(rows) + es.greedy * len(es.problems))
        rewards, lengths = _decode(lm, es, prompts, rows, gen, batch_size,
                                   greedy=es.temperature == 0, progress=progress)
        greedy = None
        if es.greedy:
            every = list(range(len(es.problems)))
            greedy_rewards, _ = _decode(lm, es, prompts, every, gen, batch_size, greedy=True,
                                        progress=progress)
            greedy = sum(greedy_rewards) / len(every)
    finally:
        lm.model.train(was_training)
    solved = [0] * len(es.problems)
    for i, r in zip(rows, rewards, strict=True):
        solved[i] += r >= es.pass_threshold
    n = es.samples
    return SetResult(
        name=es.name, problems=len(es.problems), samples=n,
        pass_at_1=sum(pass_at_k(n, c, 1) for c in solved) / len(solved),
        pass_at_k=sum(pass_at_k(n, c, n) for c in solved) / len(solved) if n > 1 else None,
        reward_mean=sum(rewards) / len(rewards), accuracy_greedy=greedy,
        response_len_mean=sum(lengths) / len(lengths))


def _decode(lm: LoadedModel, es: EvalSet, prompts: list[list[int]], rows: list[int],
            gen: torch.Generator, batch_size: int, greedy: bool, progress: Progress
            ) -> tuple[list[float], list[int]]:
    """Each row's (problem index's) answer: its reward and its length in tokens (over all
    turns, when the set plays episodes of an environment)."""
    if es.environment is not None:
        out = play(lm, es.environment, [es.problems[i] for i in rows], es.reward,
                   max_new_tokens=es.max_new_tokens, temperature=es.temperature or 1.0,
                   greedy=greedy, generator=gen, batch_size=batch_size, stop=progress.stop)
        progress.advance(len(rows))
        return out
    rewards, lengths = [], []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        outs = sample(lm.model, [prompts[i] for i in chunk], max_new_tokens=es.max_new_tokens,
                      eos_ids=lm.eos_ids, pad_id=lm.pad_id, temperature=es.temperature or 1.0,
                      greedy=greedy, generator=gen, stop=progress.stop)
        for i, c in zip(chunk, outs, strict=True):
            p = es.problems[i]
            reward, _ = score(es.reward, lm.decode(c.tokens), p.reference, metadata=p.metadata,
                              prompt=p.messages or p.text)
            rewards.append(reward)
            lengths.append(len(c.tokens))
        progress.advance(len(chunk))
    return rewards, lengths


def evaluate_sets(lm: LoadedModel, sets: list[EvalSet], *, seed: int = 0,
                  batch_size: int = 256, on_update: Callable[[int, int], None] | None = None,
                  stop: threading.Event | None = None
                  ) -> tuple[dict[str, float], list[SetResult]]:
    """One record of every set's metrics, and the per-set results (for a table).
    `on_update(done, total)` hears the sequences decoded so far; once `stop` is set, the
    decoding raises relayrl_torch.sampling.sampler.Stopped between two tokens."""
    record: dict[str, float] = {}
    results = []
    progress = Progress(sequences(sets), on_update, stop)
    for es in sets:
        result = evaluate_set(lm, es, seed=seed, batch_size=batch_size, progress=progress)
        record.update(result.record(default=es.default))
        results.append(result)
    return record, results
