"""The two asynchronous modes: `async` and `async_repack`, as one discrete-event loop.

Each worker leases prompts whenever it has a free slot and the staleness rule allows it,
and a finished group goes to the buffer; the trainer steps whenever the buffer holds a
batch. An engine holds one version at a time and its KV cache belongs to that version, so
a worker moves to new weights only once its batch is empty. Workers keep starting prompts
on their version while it is at most scheduler.max_start_lag versions behind the trainer
(the lease's min_version, relayrl.rules.staleness.oldest_startable), then drain. Draining is
where the heavy tail hurts: the last few long sequences keep a worker at a tiny batch.
With sim.tails `preempt` the worker reloads at once instead and resumes its sequences on
the new weights, their context prefilled again (the live worker at a segment boundary).
`async_repack` migrates them onto the fullest other worker of the same version with room,
when no new prompt can go to the worker (relayrl.rules.repack's rules, as the live scheduler's),
so the drained worker reloads at once; the target prefills their context again (or
receives their KV cache, with sim.migration `kv`).

The decisions are the services' own functions (relayrl.rules.staleness, relayrl.rules.repack); the
trainer's rule drops a batch's too-old groups. `trace`, a list, records the decisions for
tests/unit/test_one_rulebook.py to replay through the services' code.

A worker whose course nothing can change until its next decision (its queue refills every
slot that frees, or it can only drain) runs ahead of the clock to that decision in one go:
the same results as event by event (`run_ahead=False`), at a fraction of the cost.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict, deque
from heapq import heappop, heappush
from typing import Any

from relayrl.rules.repack import is_tail, rank_targets, repack_wanted
from relayrl.rules.staleness import behind, is_stale, may_hand_out, must_restart
from relayrl_sim.accounting import START, StepRecord, group_lags, lag_counts
from relayrl_sim.engine import SimConfig
from relayrl_sim.worker import Worker
from relayrl_sim.workload import Lengths

DECODE, TRAINED, LOADED, ARRIVE, COMPLETE = range(5)


class Streaming:
    def __init__(self, cfg: SimConfig, workers: int, repack: bool, run_ahead: bool = True):
        self.cfg, self.costs, self.repack, self.run_ahead = cfg, cfg.costs, repack, run_ahead
        self.n = workers
        self.group = cfg.workload.group_size
        self.lengths = Lengths(cfg.workload)
        self.workers = [Worker(i, cfg.costs, self.lengths.prompt, self.lengths.response,
                               self.group) for i in range(workers)]
        self.batch = workers * cfg.workload.groups_per_worker  # groups per trainer step
        self.max_staleness = cfg.max_staleness
        self.max_inflight = cfg.inflight_limit(self.batch)
        self.reprefill = cfg.migration == "reprefill"
        self.preempt = cfg.tails == "preempt"
        # by sample, when preempted: [(version, tokens generated before it), ...], from the
        # first (the prompt's) on
        self.token_versions: dict[int, list[tuple[int, int]]] = {}
        self.swaps, self.swap_tokens = 0, 0
        self.events: list[tuple[float, int, int, Any, Any]] = []
        self.order = itertools.count()
        self.version = 0  # the trainer's: steps taken
        self.leased = 0  # prompts handed out; also the next prompt id
        self.consumed = 0  # prompts trained on
        self.prompt_version: dict[int, int] = {}  # leased under; migration keeps a version
        self.finished: dict[int, tuple[int, float]] = {}  # by prompt: samples done, when last
        self.ready: deque[int] = deque()  # complete groups, in order of completion
        self.training = False
        self.idle: set[Worker] = set()
        self.holders: defaultdict[int, set[Worker]] = defaultdict(set)  # version -> workers
        self.migrations = 0
        self.migration_s, self.reprefill_tokens = 0.0, 0  # modelled cost; context re-prefilled
        self.records = [START]
        self.trace: list[tuple] | None = None

    def push(self, at: float, kind: int, obj: Any, payload: Any) -> None:
        heappush(self.events, (at, next(self.order), kind, obj, payload))

    def run(self) -> list[StepRecord]:
        for w in self.workers:
            self.holders[0].add(w)
            self.decide(w, 0.0)
        while self.version < self.cfg.steps:
            now, _, kind, obj, payload = heappop(self.events)
            if kind == DECODE:
                if payload == obj.stamp:
                    if obj.held:
                        self.finish(obj.held)
                        obj.held = []
                    if obj.plan:  # planned, not run ahead: decode up to now
                        self.finish([(now, sid) for sid in obj.advance(obj.plan)])
                    if obj.ctx + len(obj.active) > self.costs.kv_budget_tokens:
                        obj.settle()
                    self.decide(obj, now)
            elif kind == COMPLETE:
                self.ready.append(payload)
                if not self.training and len(self.ready) >= self.batch:
                    self.train(now)
            elif kind == TRAINED:
                self.trained(now, payload)
            elif kind == LOADED:
                obj.version, obj.t = payload, now
                self.holders[payload].add(obj)
                if obj.active:  # preempted: their KV belongs to the old weights
                    cost = obj.ctx * self.costs.prefill_per_token_s
                    obj.t += cost
                    obj.prefill_s += cost
                    self.swap_tokens += obj.ctx
                self.decide(obj, now)
            else:
                self.arrive(obj, payload, now)
        return self.records

    def decide(self, w: Worker, now: float) -> None:
        """What a worker does at a step boundary: refresh, take prompts, or hand off its tail."""
        if w.t < now:
            w.t = now
        active, queue = w.active, w.queue
        if not active and not queue and not w.incoming and w.version < self.version:
            self.holders[w.version].discard(w)
            self.push(now + self.costs.weight_sync_s, LOADED, w, self.version)
            return
        fresh = not behind(w.version, self.version, self.max_staleness, self.cfg.max_start_lag,
                           (self.leased - self.consumed) // self.batch)
        # at the point where it would start draining: its queue is empty (the boundary a
        # worker running ahead stops at too)
        if not fresh and self.preempt and not queue and not w.incoming and self.swap(w, now):
            return
        # the oldest token of each of its sequences is at least its prompt's version: none
        # is ever restarted (swap leaves a worker that would restart one to drain)
        assert not must_restart((w.version,), w.version, self.version, self.max_staleness)
        if self.trace is not None and active and not fresh:
            self.trace.append(("hold", w.wid, w.version, self.version))
        if fresh:
            free = self.costs.max_batch - len(active) - w.incoming - len(queue)
            while free > 0:
                if not may_hand_out(self.leased - self.consumed, self.max_inflight):
                    if self.trace is not None:
                        self.trace.append(("refused", w.wid, self.consumed))
                    break
                self.lease(w)
                free -= self.group
        if queue:
            w.fill()
        elif (self.repack and not w.incoming
              and repack_wanted(0, fresh and may_hand_out(self.leased - self.consumed,
                                                          self.max_inflight))
              and is_tail(len(active), self.costs.max_batch, self.cfg.repack_below)):
            self.hand_off(w, now)
            if not active:
                self.decide(w, now)  # now empty: reload
                return
        if not active:
            if not w.incoming:
                self.idle.add(w)
            return
        # no prompt, no migration can reach it (preempting, it swaps at its next boundary);
        # for good only if it is behind with no batch out ahead: a consumed batch lowers the
        # start floor, and a worker a version behind may start prompts again until the step ends
        drain = (not fresh and not self.repack and not self.preempt
                 and behind(w.version, self.version, self.max_staleness, self.cfg.max_start_lag))
        if self.run_ahead and not w.incoming and (queue or drain):
            assert not w.held, "a run ahead's last finishes were never counted"
            done = w.run_ahead(drain)
            at = w.t
            # the last finishes end the run at the worker's next decision; step by step they
            # are counted when that decode event fires, after events queued for the same
            # instant (a trainer step their group completes would otherwise come first)
            w.held = [d for d in done if d[0] >= at]
            self.finish([d for d in done if d[0] < at])
        else:
            at = w.plan_next()
        heappush(self.events, (at, next(self.order), DECODE, w, w.stamp))

    def swap(self, w: Worker, now: float) -> bool:
        """Reload `w` under its running sequences (sim.tails preempt); they resume on the
        new weights once it has them (LOADED). False, changing nothing, when one of them
        belongs to a group the rollout would restart on the new weights."""
        g, versions = self.group, self.prompt_version
        running = [(sid, w.rlen[sid] - (finish - w.step)) for finish, _, sid, _ in w.active]
        if any(must_restart((versions[sid // g],), self.version, self.version,
                            self.max_staleness) for sid, _ in running):
            return False
        for sid, generated in running:
            if generated:
                bounds = self.token_versions.setdefault(sid, [(versions[sid // g], 0)])
                bounds.append((self.version, generated))
        if self.trace is not None:
            self.trace.append(("swap", w.wid, w.version, self.version,
                               sorted({versions[sid // g] for sid, _ in running})))
        self.holders[w.version].discard(w)
        w.stamp += 1  # its planned decode is void: it pauses for the weights
        self.swaps += 1
        self.push(max(now, w.t) + self.costs.weight_sync_s, LOADED, w, self.version)
        return True

    def lease(self, w: Worker) -> None:
        prompt = self.leased
        self.leased += 1
        if self.leased > len(self.lengths.prompt):
            self.lengths.ensure(self.leased)
        self.prompt_version[prompt] = w.version
        if self.trace is not None:
            self.trace.append(("lease", w.wid, self.consumed, prompt))
        w.queue.extend(zip(range(prompt * self.group, (prompt + 1) * self.group),
                           itertools.repeat(0, self.group), strict=True))

    def hand_off(self, w: Worker, now: float) -> None:
        """Move w's sequences to the fullest workers of its version that have room; a target
        must be fuller than w (ties by id), so sequences only ever consolidate."""
        peers = {d.wid: d for d in self.holders[w.version] if d.t <= now}  # not run ahead
        loads = {wid: d.cap - d.room() for wid, d in peers.items()}
        for wid in rank_targets(w.wid, len(w.active), loads, w.cap):
            d = peers[wid]
            moved, tokens, room, kv = [], 0, d.room(), d.kv_room()
            while w.active and room > 0 and w.last_context() <= kv:
                sid, generated, ctx = w.take_last()
                moved.append((sid, generated))
                tokens, room, kv = tokens + ctx, room - 1, kv - ctx
            if moved:
                d.incoming += len(moved)
                d.incoming_ctx += tokens
                self.migrations += len(moved)
                delay = (self.costs.migrate_fixed_s if self.reprefill
                         else self.costs.migrate_s(tokens))
                self.migration_s += delay  # one transfer carries them all
                self.push(now + delay, ARRIVE, d, (moved, tokens))
            if not w.active:
                break
        w.stamp += 1  # its planned decode is void: the batch changed

    def arrive(self, d: Worker, payload: tuple[list[tuple[int, int]], int], now: float) -> None:
        moved, tokens = payload
        self.finish([(d.t, sid) for sid in d.advance_to(now)])  # join at the step boundary
        d.incoming -= len(moved)
        d.incoming_ctx -= tokens
        for sid, generated in moved:
            d.join(sid, generated)
        if self.reprefill:  # before its next decode step, as a prefill would
            cost = tokens * self.costs.prefill_per_token_s
            d.t = max(d.t, now) + cost
            d.prefill_s += cost
            self.migration_s += cost
            self.reprefill_tokens += tokens
        d.settle()
        self.decide(d, now)

    def finish(self, samples: list[tuple[float, int]]) -> None:
        """Count finished samples; a group completes with its last one, at that one's time
        (which a worker that ran ahead reports before the clock gets there)."""
        for at, sid in samples:
            prompt = sid // self.group
            done, last = self.finished.pop(prompt, (0, 0.0))
            if done + 1 == self.group:
                self.push(max(last, at), COMPLETE, None, prompt)
            else:
                self.finished[prompt] = (done + 1, max(last, at))

    def train(self, now: float) -> None:
        """Take a batch and train on what the staleness rule keeps: the rest is dropped, and
        the trainer steps past it all."""
        g, lengths = self.group, self.lengths
        prompts = [self.ready.popleft() for _ in range(self.batch)]
        kept, dropped, lags, tokens, versions = [], 0, [], 0, []
        for p in prompts:
            version = self.prompt_version.pop(p)
            versions.append((p, version))
            response = sum(lengths.response[p * g:(p + 1) * g])
            bounds = [self.token_versions.pop(sid, None) for sid in range(p * g, (p + 1) * g)]
            if is_stale(version, self.version, self.max_staleness):
                dropped += response
                continue
            kept.append(p)
            tokens += response + g * lengths.prompt[p]
            lags += group_lags(self.version, version, bounds,
                               lengths.response[p * g:(p + 1) * g])
        if self.trace is not None:
            self.trace.append(("train", self.version, versions, kept))
        train_s = self.costs.train_step_s(tokens, self.n)
        self.training = True
        self.consumed += len(prompts)
        self.push(now + train_s, TRAINED, None, StepRecord(
            time=0.0, samples=len(kept) * g, tokens=sum(t for _, _, t in lags),
            dropped_samples=(len(prompts) - len(kept)) * g, dropped_tokens=dropped,
            lags=lag_counts(lags), train_s=train_s))
        self.wake(now)  # the cap on prompts out has room again

    def trained(self, now: float, step: StepRecord) -> None:
        self.version += 1
        self.training = False
        self.records.append(dataclasses.replace(
            step, time=now, busy=sum(w.busy_at(now) for w in self.workers),
            migrations=self.migrations, migration_s=self.migration_s,
            reprefill_tokens=self.reprefill_tokens,
            recompute_tokens=sum(w.recomputed for w in self.workers),
            preemptions=sum(w.preemptions for w in self.workers),
            swaps=self.swaps, swap_tokens=self.swap_tokens))
        if len(self.ready) >= self.batch:
            self.train(now)
        self.wake(now)

    def wake(self, now: float) -> None:
        idle, self.idle = self.idle, set()
        for w in sorted(idle, key=lambda w: w.wid):
            self.decide(w, now)
