"""A lost or repeated reply changes nothing : on the real stack the
scheduler and the buffer carry out every call but a seeded schedule (relayrl.runtime.reply_faults)
drops the replies of some of each method (the caller sees UNAVAILABLE) and holds others
past the caller's deadline. The workers retry: a lease request with the same request id, a
Complete until it is answered, a Release or Register again. An agent submits groups of its
own through relayrl.plugins.buffer_client (the same request_id on every attempt) and sends each
again besides, as a client that never saw its answer would. The run must reach its last
step with the books balanced, every prompt completed once, each external group taken in
once and no lease left out; before the lease calls were safe to repeat, a dropped
AcquireLeases reply left a lease its worker's heartbeats renewed for ever, and the run
stalled at the in-flight cap. Status and Stats, how a test watches,
keep their replies."""

import os
import re
import uuid
from pathlib import Path

import grpc
import pytest

from relayrl.contracts.keys import is_external
from relayrl.contracts.leases import GrpcLeaseClient
from relayrl.contracts.proto.v1 import (
    buffer_pb2,
    buffer_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from relayrl.plugins.buffer_client import submit_group
from relayrl.runtime.metrics import read_metrics
from relayrl.runtime.reply_faults import ENV
from scheduler_svc.server import LOSABLE_METHODS
from tests.conftest import channel, snapshot
from tests.integration.live_stack import running, stack_config, wait_for

pytestmark = pytest.mark.integration

STEPS = 10
# seed 244 meets a dropped reply within the first few calls of every method's stream (the
# first Release, Heartbeat, SaveProgress and AcquireLeases, the third Register, the fifth
# Complete; Submit's 7th call is dropped, its 13th late), so each kind of loss happens in
# a short run
SEED, DROP, LATE = 244, 0.15, 0.05
ME = "chaos-client"
EXTERNAL = 2  # groups the agent submits; the scheduler leases the rest of the run's
SUBMIT_TIMEOUT_S = 5.0  # a late reply costs the agent this long
DROPPED = re.compile(r"lost reply: Buffer\.Submit call \d+ dropped")
HELD = re.compile(r"lost reply: Buffer\.Submit call \d+ answered after its deadline")


def retried(call, failures: list):
    """`call()` until a reply comes, as a client that may repeat the call does."""
    while True:
        try:
            return call()
        except grpc.RpcError as err:
            assert err.code() in (grpc.StatusCode.UNAVAILABLE,
                                  grpc.StatusCode.DEADLINE_EXCEEDED), err
            failures.append(err.code())


def hand_back_the_first_leases(client: GrpcLeaseClient, cfg) -> list:
    """Take the run's first leases, the whole in-flight cap, and hand each back. The
    scheduler's gate waits for this client besides the workers, and only an acquire opens
    it, so these are the run's first Release calls: the seed's schedule, not a race with the
    workers for leases, decides which replies are lost. Each repeat of a Release whose reply
    was lost is accepted, as the first call was. Returns the failures the client saw."""
    stub = scheduler_pb2_grpc.SchedulerStub(channel(cfg.scheduler.endpoint.address))
    wait_for(lambda: stub.Status(scheduler_pb2.SchedulerStatusRequest(),
                                 timeout=5).workers == cfg.rollout.num_workers,
             120, "every worker registered")
    request_id = uuid.uuid4().hex  # the same on every attempt: a repeat, not a new request
    batch = retried(lambda: client.acquire(ME, cfg.inflight_limit, request_id), [])
    assert len(batch.leases) == cfg.inflight_limit, batch  # the gate opened for us
    failures: list = []
    for lease in batch.leases:
        assert retried(lambda lease_id=lease.lease_id: client.release(ME, lease_id), failures)
    return failures


class Agent:
    """A custom-rollout client as the README describes one: Generate on a worker, then
    Buffer.Submit of the group with relayrl.plugins.buffer_client, on the agent token."""

    def __init__(self, cfg, worker: str):
        self.token = [("authorization", f"Bearer {os.environ[cfg.auth.agent_token_env]}")]
        self.channels = [grpc.insecure_channel(a) for a in (worker, cfg.buffer.endpoint.address)]
        self.rollout = rollout_pb2_grpc.RolloutStub(self.channels[0])
        self.buffer = buffer_pb2_grpc.BufferStub(self.channels[1])
        self.groups: dict[str, list[buffer_pb2.Trajectory]] = {}  # request_id -> group
        self.prompt_ids: dict[str, int] = {}  # request_id -> the prompt id first answered
        self.calls = 0  # Submit calls made, retries included

    def Submit(self, request, **kw):  # the buffer stub submit_group is handed: counts calls
        self.calls += 1
        return self.buffer.Submit(request, **kw)

    def generate(self, size: int) -> list[buffer_pb2.Trajectory]:
        reply = self.rollout.Generate(rollout_pb2.GenerateRequest(
            text="1+2=", n=size, max_new_tokens=3), metadata=self.token, timeout=60,
            wait_for_ready=True)
        return [buffer_pb2.Trajectory(  # rewards 0 and 1 in turn: a group GRPO learns from
            prompt_tokens=reply.prompt_token_ids, response_tokens=s.token_ids,
            logprobs=s.logprobs, versions=s.versions, reward=float(i % 2),
            finish_reason=s.finish_reason) for i, s in enumerate(reply.sequences)]

    def submit(self, request_id: str) -> int:
        reply = submit_group(self, self.groups[request_id], source=ME, metadata=self.token,
                             timeout_s=SUBMIT_TIMEOUT_S, request_id=request_id)
        first = self.prompt_ids.setdefault(request_id, reply.prompt_id)
        assert reply.prompt_id == first, (request_id, reply.prompt_id, first)
        return reply.prompt_id

    def submit_new(self, size: int) -> None:
        """One group in, generated again while the trainer has already moved past the
        worker's version (FAILED_PRECONDITION), as the refusal tells a client to."""
        def fresh_group_taken() -> bool:
            request_id = uuid.uuid4().hex
            self.groups[request_id] = self.generate(size)
            try:
                self.submit(request_id)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                del self.groups[request_id]  # refused whole: nothing went in
                return False
            return True

        wait_for(fresh_group_taken, 120, "a group of the worker's weights not yet stale")

    def close(self) -> None:
        for ch in self.channels:
            ch.close()


def submit_until_a_reply_is_dropped_and_one_is_late(agent: Agent, size: int,
                                                    buffer_log: Path) -> int:
    """EXTERNAL groups in, then each sent again (same request_id, same group), round after
    round, until the buffer's log shows a Submit reply dropped and one held late. Every
    answer names the group's first prompt id. Returns the rounds of repeats."""
    for _ in range(EXTERNAL):
        agent.submit_new(size)
    rounds = 0

    def one_round() -> bool:
        nonlocal rounds
        text = buffer_log.read_text()
        if DROPPED.search(text) and HELD.search(text):
            return True
        rounds += 1
        for request_id in agent.groups:
            agent.submit(request_id)
        return False

    wait_for(one_round, 120, "a Submit reply dropped and one held late, then answered")
    return rounds


def test_lost_and_late_replies_change_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, f"{SEED},{DROP},{LATE}")  # the services inherit it
    # the scheduler leases what the agent's groups leave of STEPS batches of 2 groups
    max_prompts = STEPS * 2 - EXTERNAL
    cfg = stack_config(tmp_path, STEPS, scheduler={"call_timeout_s": 2.0,
                                                   "heartbeat_interval_s": 0.5,
                                                   "max_prompts": max_prompts},
                       rollout={"save_every_s": 0})
    # the gate opens for this test's client, once every worker is in
    cfg.scheduler.start_after_workers = cfg.rollout.num_workers + 1
    assert cfg.buffer.groups_per_batch == 2
    with running(cfg) as launcher:
        cfg = launcher.cfg
        logs = cfg.run_path / "logs"
        client = GrpcLeaseClient(cfg.scheduler.endpoint.address, cfg.scheduler.call_timeout_s)
        try:
            assert hand_back_the_first_leases(client, cfg), "no Release reply was lost"
            incarnation = uuid.uuid4().hex
            register_failures: list = []
            while not register_failures:  # repeated: the same process, nothing changes
                retried(lambda: client.register(ME, "test", incarnation), register_failures)
        finally:
            client.close()
        # the run's last batch needs the agent's groups: it cannot end before they are in
        agent = Agent(cfg, f"127.0.0.1:{cfg.rollout.base_port}")
        try:
            repeats = submit_until_a_reply_is_dropped_and_one_is_late(
                agent, cfg.buffer.group_size, logs / "buffer.log")
        finally:
            agent.close()
        assert launcher.wait(timeout_s=600) == 0
        state = snapshot(cfg)
    sched = state["scheduler"]
    audit = state["audit"]
    assert audit.balanced, audit.render()
    assert audit.counts["in_flight"] == 0 and audit.counts["failed"] == 0, audit.render()
    assert audit.counts["awaiting_trainer"] == 0, audit.render()
    assert sched.active_leases == 0 and sched.failed == 0
    # every prompt counted once, however many of its Complete calls were repeated
    assert sched.handed_out == sched.leases_completed == cfg.scheduler.max_prompts
    # each external group went in once, however many of its Submit calls were repeated:
    # one prompt id each, assembled once, trained or dropped once, nothing left behind
    buffer_log = (logs / "buffer.log").read_text()
    stats = state["buffer"]
    lost_submits = len(DROPPED.findall(buffer_log)) + len(HELD.findall(buffer_log))
    assert stats.groups_submitted == EXTERNAL and stats.groups_duplicate == 0, stats
    assert stats.submits_repeated == buffer_log.count("repeated Submit: already had")
    # every call after a group's first was carried out as a repeat, refusals aside: the
    # deliberate ones and the retries of those whose reply was lost (a call whose deadline
    # passed before the buffer took it up is never carried out, hence at most)
    assert (repeats * EXTERNAL + lost_submits <= stats.submits_repeated
            <= agent.calls - stats.submits_stale - EXTERNAL), (repeats, lost_submits,
                                                                agent.calls, stats)
    ours = set(agent.prompt_ids.values())
    assert len(ours) == EXTERNAL and all(map(is_external, ours))
    external = {name: {p for p in ids if is_external(p)}
                for name, ids in state["ledger"].items()}
    assert external["batched"] == ours == external["consumed"] | external["dropped"], external
    assert (stats.trajectory_stream_len, stats.partial_groups, stats.ready_groups) == (0, 0, 0)
    rows = read_metrics(cfg.run_path / "metrics.jsonl")
    assert sum(row.get("train/external_groups", 0) for row in rows) == EXTERNAL
    log = (logs / "scheduler.log").read_text()
    lost = {m: len(re.findall(rf"lost reply: Scheduler\.{m} call \d+ dropped", log))
            for m in LOSABLE_METHODS}
    assert all(lost.values()), lost
    assert "answered after its deadline" in log
    worker_logs = "".join((cfg.run_path / "logs" / f"rollout-{i}.log").read_text()
                          for i in range(cfg.rollout.num_workers))
    assert "UNAVAILABLE" in worker_logs
    print(f"replies dropped per method: {lost}; leases re-issued as unheld: "
          f"{sched.leases_unheld}; expired: {sched.leases_expired}; Submit: {agent.calls} "
          f"calls, {lost_submits} replies lost, {stats.submits_repeated} answered as repeats, "
          f"{stats.submits_stale} refused as stale")
