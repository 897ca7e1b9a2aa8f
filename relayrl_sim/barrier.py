"""The two barrier modes: `sync` and `one_step_off`.

Every step hands each worker its share of the batch (groups_per_worker prompts), all at
once; the step ends when the slowest worker's longest sequence finishes. Workers do not
interact within a step, so each runs on its own clock and the barrier is their maximum.
"""

from __future__ import annotations

import numpy as np

from relayrl.rules.staleness import is_stale
from relayrl_sim.accounting import START, StepRecord
from relayrl_sim.engine import SimConfig
from relayrl_sim.worker import KV_ADMIT, Worker
from relayrl_sim.workload import Lengths


class Fleet:
    def __init__(self, cfg: SimConfig, workers: int):
        self.cfg = cfg
        self.n = workers
        self.lengths = Lengths(cfg.workload)
        group = cfg.workload.group_size
        self.workers = [Worker(i, cfg.costs, self.lengths.prompt, self.lengths.response, group)
                        for i in range(workers)]

    def prompts(self, step: int) -> range:
        per_step = self.n * self.cfg.workload.groups_per_worker
        self.lengths.ensure((step + 1) * per_step)
        return range(step * per_step, (step + 1) * per_step)

    def generate(self, step: int, start: float, vectorized: bool = True) -> float:
        """Every worker generates its share of batch `step` from `start`; the barrier time.
        Workers the closed form cannot do (KV overflow, more than a batch) run event by
        event; `vectorized=False` runs them all that way."""
        g, per_worker = self.cfg.workload.group_size, self.cfg.workload.groups_per_worker
        first = self.prompts(step).start * g
        batch = per_worker * g
        ends = self.closed_form(first, start) if vectorized else None
        for i, w in enumerate(self.workers):
            if ends is not None and ends[i] >= 0:
                continue
            lo = first + i * batch
            w.t = start
            w.queue.extend((sid, 0) for sid in range(lo, lo + batch))
            w.fill()
            while w.active:
                w.settle()
                w.plan_next()
                w.advance(w.plan)
                w.fill()
        return max(w.t for w in self.workers)

    def closed_form(self, first: int, start: float) -> np.ndarray | None:
        """All workers' shares at once, when each fits in one batch and the KV cache: sort
        each worker's responses; between the j-th and (j+1)-th finish, S - j sequences
        decode. Sets each worker's clock and busy time; -1 marks a worker left to the event
        loop (its KV cache would overflow)."""
        c, wl = self.cfg.costs, self.cfg.workload
        g, batch = wl.group_size, wl.groups_per_worker * wl.group_size
        if batch > c.max_batch:
            return None
        sids = np.arange(first, first + self.n * batch)
        response = np.asarray(self.lengths.response[sids[0]:sids[-1] + 1]).reshape(self.n, -1)
        prompt = np.asarray(self.lengths.prompt)[sids // g].reshape(self.n, -1)
        order = np.argsort(response, axis=1, kind="stable")
        done_at = np.take_along_axis(response, order, axis=1)
        before = np.concatenate([np.zeros((self.n, 1), np.int64), done_at[:, :-1]], axis=1)
        k = done_at - before  # steps in each stretch
        n = batch - np.arange(batch)  # sequences decoding in each stretch
        held = np.cumsum(np.take_along_axis(prompt, order, axis=1)[:, ::-1], axis=1)[:, ::-1]
        ctx = held + n * before  # context at each stretch's start
        dur = k * (c.decode_fixed_s + c.decode_per_seq_s * n + c.decode_per_token_s * ctx) \
            + c.decode_per_token_s * n * k * (k - 1) / 2
        fits = ((ctx + n * k).max(axis=1) <= c.kv_budget_tokens) \
            & (held[:, 0] <= KV_ADMIT * c.kv_budget_tokens)
        prefill = prompt[:, ::g].sum(axis=1) * c.prefill_per_token_s
        ends = np.where(fits, start + prefill + dur.sum(axis=1), -1.0)
        busy = (n * dur).sum(axis=1)
        for i, w in enumerate(self.workers):
            if fits[i]:
                w.t, w.busy, w.step = ends[i], w.busy + busy[i], w.step + int(done_at[i, -1])
                w.prefill_s += prefill[i]
        return ends

    def tokens(self, step: int) -> tuple[int, int]:
        """(response tokens, prompt + response tokens) of batch `step`."""
        g = self.cfg.workload.group_size
        prompts = self.prompts(step)
        response = sum(self.lengths.response[prompts.start * g:prompts.stop * g])
        prompt = g * sum(self.lengths.prompt[prompts.start:prompts.stop])
        return response, prompt + response

    def record(self, step: int, at: float, staleness: int, train_s: float) -> StepRecord:
        """Step `step`'s record: its batch is `staleness` versions old throughout, so the
        staleness rule keeps all of it or none."""
        samples = len(self.prompts(step)) * self.cfg.workload.group_size
        tokens = self.tokens(step)[0]
        common = dict(time=at, train_s=train_s, busy=sum(w.busy for w in self.workers),
                      recompute_tokens=sum(w.recomputed for w in self.workers),
                      preemptions=sum(w.preemptions for w in self.workers))
        if is_stale(step - staleness, step, self.cfg.max_staleness):
            return StepRecord(dropped_samples=samples, dropped_tokens=tokens, **common)
        return StepRecord(samples=samples, tokens=tokens, lags=((staleness, samples, tokens),),
                          **common)


def run_sync(cfg: SimConfig, workers: int) -> list[StepRecord]:
    """Generate the batch, wait for all of it, train, broadcast the weights, repeat."""
    fleet, t, records = Fleet(cfg, workers), 0.0, [START]
    for step in range(cfg.steps):
        generated = fleet.generate(step, t)
        train_s = cfg.costs.train_step_s(fleet.tokens(step)[1], workers)  # never stale
        t = generated + train_s + cfg.costs.weight_sync_s
        records.append(fleet.record(step, t, 0, train_s))
    return records


def run_one_step_off(cfg: SimConfig, workers: int) -> list[StepRecord]:
    """While the trainer trains on batch k (version k -> k+1), the workers generate batch k+1
    with version k; both then wait for each other and the new weights are broadcast. Every
    batch but the first is one version stale."""
    fleet, records = Fleet(cfg, workers), [START]
    t = fleet.generate(0, 0.0)  # batch 0 comes from version 0 with nothing to overlap
    for step in range(cfg.steps):
        train_s = cfg.costs.train_step_s(fleet.tokens(step)[1], workers)
        generated = fleet.generate(step + 1, t)
        t = max(t + train_s, generated) + cfg.costs.weight_sync_s
        records.append(fleet.record(step, t, 1 if step else 0, train_s))
    return records
