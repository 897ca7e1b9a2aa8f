"""One generation worker: continuous batching, advanced in closed form from event to event.

Between two events (a sequence finishing, the KV cache filling up, a migration arriving) the
batch does not change, so k decode steps of n sequences holding C context tokens take
k * (a + b*n + c*C) + c*n*k*(k-1)/2 seconds: each step adds n tokens of context. The worker
never simulates single tokens, which is what makes a thousand of them cheap.
"""

from __future__ import annotations

import math
from collections import deque
from heapq import heapify, heappop, heappush

from relayrl_sim.costs import CostParams

KV_ADMIT = 0.9  # start or receive sequences only below this KV fill, leaving room to grow


class Worker:
    __slots__ = ("wid", "costs", "a", "b", "c", "cap", "kv_limit", "plen", "rlen", "group", "t",
                 "step", "active",
                 "ctx", "queue", "version", "incoming", "incoming_ctx", "busy", "prefill_s",
                 "preemptions", "recomputed", "joins", "plan", "plan_s", "plan_end", "stamp",
                 "marks", "held")

    def __init__(self, wid: int, costs: CostParams, prompt_len: list[int],
                 response_len: list[int], group_size: int):
        self.wid = wid
        self.costs = costs
        self.a, self.b, self.c = (costs.decode_fixed_s, costs.decode_per_seq_s,
                                  costs.decode_per_token_s)
        self.cap = costs.max_batch
        self.kv_limit = int(KV_ADMIT * costs.kv_budget_tokens)  # for starting sequences
        self.plen = prompt_len  # by prompt id, shared with the workload
        self.rlen = response_len  # by sample id
        self.group = group_size
        self.t = 0.0  # time of this worker's current step boundary
        self.step = 0  # decode steps taken so far
        # heap of (finish step, join order, sample, its context when it finishes)
        self.active: list[tuple[int, int, int, int]] = []
        self.ctx = 0  # context tokens held in the KV cache by the active sequences
        self.queue: deque[tuple[int, int]] = deque()  # (sample, tokens generated) to start
        self.version = 0  # weights this worker generates with
        self.incoming = 0  # sequences migrating here, their slots reserved
        self.incoming_ctx = 0
        self.busy = 0.0  # sequence-seconds spent decoding: utilization's numerator
        self.prefill_s = 0.0
        self.preemptions = 0
        self.recomputed = 0  # context tokens prefilled again after a preemption
        self.joins = 0
        self.plan = 0  # decode steps until the next event
        self.plan_s = 0.0  # and how long they take
        self.plan_end = 0.0
        self.stamp = 0  # bumped on every re-plan; stale events carry an old one
        # stretches decoded ahead of the simulation's clock: (start, end, batch, busy before)
        self.marks: list[tuple[float, float, int, float]] = []
        self.held: list[tuple[float, int]] = []  # finishes at the end of a run ahead

    def room(self) -> int:
        return self.cap - len(self.active) - self.incoming

    def kv_room(self) -> int:
        return self.kv_limit - self.ctx - self.incoming_ctx

    def join(self, sid: int, generated: int) -> None:
        """Add a sequence that already has its KV cache (migrated, or just prefilled)."""
        prompt, response = self.plen[sid // self.group], self.rlen[sid]
        heappush(self.active, (self.step + response - generated, self.joins, sid,
                               prompt + response))
        self.joins += 1
        self.ctx += prompt + generated

    def fill(self) -> None:
        """Start queued sequences while a slot and KV room are free; their prefill runs
        before the next decode step."""
        queue, active, tokens = self.queue, self.active, 0
        while queue and len(active) + self.incoming < self.cap:
            sid, generated = queue[0]
            prompt = self.plen[sid // self.group]
            if active and self.ctx + self.incoming_ctx + prompt + generated > self.kv_limit:
                break
            queue.popleft()
            # a group's samples share their prompt's KV (prefix cache): the first computes it;
            # a preempted sequence recomputes everything it had
            if generated or sid % self.group == 0:
                tokens += prompt + generated
            if generated:
                self.recomputed += prompt + generated
            response = self.rlen[sid]
            heappush(active, (self.step + response - generated, self.joins, sid,
                              prompt + response))
            self.joins += 1
            self.ctx += prompt + generated
        if tokens:
            cost = tokens * self.costs.prefill_per_token_s
            self.t += cost
            self.prefill_s += cost

    def settle(self) -> None:
        """Preempt the newest sequences while the next step would overflow the KV cache
        (vLLM's policy); they wait at the head of the queue and recompute when readmitted."""
        active = self.active
        while len(active) > 1 and self.ctx + len(active) > self.costs.kv_budget_tokens:
            i = max(range(len(active)), key=lambda j: active[j][1])
            finish, _, sid, final = active[i]
            active[i] = active[-1]
            active.pop()
            heapify(active)
            self.ctx -= final - (finish - self.step)
            self.queue.appendleft((sid, self.rlen[sid] - (finish - self.step)))
            self.preemptions += 1

    def duration(self, k: int) -> float:
        n = len(self.active)
        return k * (self.a + self.b * n + self.c * self.ctx) + self.c * n * k * (k - 1) / 2

    def plan_next(self) -> float:
        """Plan decoding up to the next finish or KV overflow; return when that is."""
        self.stamp += 1
        n = len(self.active)
        if not n:
            self.plan, self.plan_s, self.plan_end = 0, 0.0, self.t
            return math.inf
        kv_steps = (self.costs.kv_budget_tokens - self.ctx) // n
        self.plan = max(1, min(self.active[0][0] - self.step, kv_steps))
        self.plan_s = self.duration(self.plan)
        self.plan_end = self.t + self.plan_s
        return self.plan_end

    def advance(self, k: int) -> list[int]:
        """Decode k steps (at most the plan: the batch has not changed since planning);
        return the samples that finished."""
        active = self.active
        if k:
            n, dt = len(active), self.plan_s if k == self.plan else self.duration(k)
            self.busy += n * dt
            self.t += dt
            self.ctx += n * k
            self.step += k
        done = []
        step = self.step
        while active and active[0][0] <= step:
            entry = heappop(active)
            self.ctx -= entry[3]
            done.append(entry[2])
        return done

    def advance_to(self, now: float) -> list[int]:
        """Decode the planned steps begun by `now`: an interruption lands on the boundary
        of the step in progress."""
        if not self.active or now <= self.t:
            return []
        n = len(self.active)
        a = self.a + self.b * n + self.c * self.ctx
        h = self.c * n / 2  # duration(k) = a*k + h*k*(k-1)
        dt = now - self.t
        if h > 0:
            k = math.ceil((-(a - h) + math.sqrt((a - h) ** 2 + 4 * h * dt)) / (2 * h))
        else:
            k = math.ceil(dt / a)
        return self.advance(min(max(k, 0), self.plan))

    def take_last(self) -> tuple[int, int, int]:
        """Remove a running sequence for migration (the heap's last entry: popping it keeps
        the heap valid); return (sample, tokens generated, context tokens)."""
        finish, _, sid, final = self.active.pop()
        ctx = final - (finish - self.step)
        self.ctx -= ctx
        return sid, self.rlen[sid] - (finish - self.step), ctx

    def last_context(self) -> int:
        finish, _, _, final = self.active[-1]
        return final - (finish - self.step)

    def run_ahead(self, drain: bool) -> list[tuple[float, int]]:
        """Decode finish after finish for as long as nothing outside the worker can change
        its course, and return (time, sample) for each finish. That is while every freed
        slot is taken again from the queue, or no new prompt can come at all (`drain`: it
        only empties); it stops where the KV cache would overflow. Its clock then runs ahead
        of the simulation's; `marks` let busy_at answer for the times in between."""
        done: list[tuple[float, int]] = []
        marks: list[tuple[float, float, int, float]] = []
        active, queue, budget, cap = self.active, self.queue, self.costs.kv_budget_tokens, self.cap
        a, b, c, plen, rlen, group = self.a, self.b, self.c, self.plen, self.rlen, self.group
        t, step, ctx, busy = self.t, self.step, self.ctx, self.busy
        while active:  # the simulator's hot loop: plan_next and advance, inlined
            n = len(active)
            k = active[0][0] - step
            if (budget - ctx) // n < k:
                k = max(1, (budget - ctx) // n)
            dt = k * (a + b * n + c * ctx) + c * n * k * (k - 1) / 2  # duration(k)
            marks.append((t, t + dt, n, busy))
            busy += n * dt
            t += dt
            ctx += n * k
            step += k
            freed = 0
            while active and active[0][0] <= step:
                _, _, sid, final = heappop(active)
                ctx -= final
                done.append((t, sid))
                freed += 1
            if not freed or ctx + len(active) > budget:
                break
            if not drain and len(active) + self.incoming + len(queue) < cap:
                break  # a slot the queue cannot fill: whether to lease is a decision
            if not queue:
                continue
            sid, generated = queue[0]
            prompt = plen[sid // group]
            if (len(active) + self.incoming + 1 == cap and not generated and sid % group
                    and ctx + self.incoming_ctx + prompt <= self.kv_limit):
                # fill() in its common case: a sibling of a running sample takes the last slot
                queue.popleft()
                heappush(active, (step + rlen[sid], self.joins, sid, prompt + rlen[sid]))
                self.joins += 1
                ctx += prompt
            else:
                self.t, self.step, self.ctx = t, step, ctx
                self.fill()
                t, ctx = self.t, self.ctx
        self.t, self.step, self.ctx, self.busy = t, step, ctx, busy
        self.marks, self.plan = marks, 0
        self.stamp += 1
        return done

    def busy_at(self, now: float) -> float:
        """Sequence-seconds decoded by `now`, counting the planned stretch in progress."""
        if now < self.t:  # prefilling, or run ahead
            for start, end, n, busy in self.marks:
                if now < end:
                    return busy + n * max(0.0, now - start)
            return self.busy
        if not self.plan:
            return self.busy
        return self.busy + len(self.active) * (min(now, self.plan_end) - self.t)
