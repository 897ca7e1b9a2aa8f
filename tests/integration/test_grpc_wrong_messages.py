"""Well-formed but wrong messages to every gRPC method of every service on the real stack:
every field of every request filled with values drawn by hypothesis (unknown ids, negative
and huge numbers, random text and bytes, wrong lists). A refused call must carry a status
and a message, and must leave the run's state exactly as it was: each service's durable
counters and every Redis key with its size. Inputs tried per method are printed."""

from __future__ import annotations

import time

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor as FD
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayrl.config import RunConfig
from relayrl.contracts.keys import EXTERNAL_PROMPT_BASE, RunKeys
from relayrl.contracts.proto.v1 import (
    buffer_pb2,
    buffer_pb2_grpc,
    relay_pb2,
    relay_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    trainer_pb2,
    trainer_pb2_grpc,
)
from relayrl.plugins.buffer_client import submit_group
from relayrl.runtime.grpc_util import channel, check_health
from relayrl.runtime.redis_conn import connect
from relayrl_ops.launcher import Launcher
from tests.conftest import small_stack_config

pytestmark = pytest.mark.integration

MODULES = {"buffer": buffer_pb2, "relay": relay_pb2, "scheduler": scheduler_pb2,
           "trainer": trainer_pb2, "rollout-0": rollout_pb2}
PER_METHOD = 25
INTS = st.sampled_from([0, 1, -1, 7, 2**31 - 1, 2**31, 2**63 - 1, -(2**63)]) | st.integers(
    -(2**63), 2**63 - 1)
INT32S = st.integers(-(2**31), 2**31 - 1)
UINTS = st.sampled_from([0, 1, 2**32 - 1]) | st.integers(0, 2**32 - 1)
TEXT = st.sampled_from(["", "rollout-0", "rollout-1", "L1", "itest", "x" * 300]) | st.text(
    max_size=20)
SCALARS = {
    FD.TYPE_INT64: INTS, FD.TYPE_SINT64: INTS, FD.TYPE_SFIXED64: INTS,
    FD.TYPE_INT32: INT32S, FD.TYPE_SINT32: INT32S,
    FD.TYPE_UINT32: UINTS, FD.TYPE_FIXED32: UINTS, FD.TYPE_UINT64: st.integers(0, 2**64 - 1),
    FD.TYPE_FIXED64: st.integers(0, 2**64 - 1),
    FD.TYPE_BOOL: st.booleans(), FD.TYPE_STRING: TEXT,
    FD.TYPE_DOUBLE: st.floats(allow_nan=True), FD.TYPE_FLOAT: st.floats(width=32),
    FD.TYPE_BYTES: st.binary(max_size=64) | st.sampled_from([b"", b"\x80", b"\x93\x01\x02\x03"]),
}


def field_values(f: FD, depth: int):
    if f.type == FD.TYPE_MESSAGE:
        single = message_dicts(f.message_type, depth + 1)
    elif f.type == FD.TYPE_ENUM:
        single = st.sampled_from([v.number for v in f.enum_type.values])
    else:
        single = SCALARS[f.type]
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        return st.dictionaries(field_values(key, depth), field_values(value, depth), max_size=3)
    if f.is_repeated:
        return st.lists(single, max_size=3)
    return single


def message_dicts(desc, depth: int = 0):
    if depth > 3:
        return st.just({})
    return st.fixed_dictionaries({}, optional={
        f.name: field_values(f, depth) for f in desc.fields})


def build(cls, values: dict):
    """A message of `cls` from a dict of drawn field values (maps and nested messages too)."""
    msg = cls()
    for name, value in values.items():
        f = cls.DESCRIPTOR.fields_by_name[name]
        target = getattr(msg, name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            nested = f.message_type.fields_by_name["value"].type == FD.TYPE_MESSAGE
            for k, v in value.items():
                if nested:
                    target[k].CopyFrom(build(type(target[k]), v))
                else:
                    target[k] = v
        elif f.type == FD.TYPE_MESSAGE and f.is_repeated:
            for v in value:
                item = target.add()
                item.CopyFrom(build(type(item), v))
        elif f.type == FD.TYPE_MESSAGE:
            target.CopyFrom(build(type(target), value))
        elif f.is_repeated:
            target.extend(value)
        else:
            setattr(msg, name, value)
    return msg


def wait_until_settled(launcher: Launcher, timeout_s: float = 60.0) -> None:
    """Until every worker of the idle stack has registered: a worker registers after it
    reports healthy, and a state taken before that would differ from any taken after."""
    stub = scheduler_pb2_grpc.SchedulerStub(channel(launcher.cfg.scheduler.endpoint.address))
    deadline = time.monotonic() + timeout_s
    while stub.Status(scheduler_pb2.SchedulerStatusRequest(), timeout=10).workers < (
            launcher.cfg.rollout.num_workers):
        assert time.monotonic() < deadline, "the stack's workers did not all register"
        time.sleep(0.2)


def state(launcher: Launcher) -> dict:
    """What a refused call must not change: durable counters of every service (not the
    counters of refusals themselves) and every Redis key with its type and size."""
    cfg = launcher.cfg
    address = {c.name: c.address for c in launcher.children}
    sched = scheduler_pb2_grpc.SchedulerStub(channel(address["scheduler"])).Status(
        scheduler_pb2.SchedulerStatusRequest(), timeout=10)
    buf = buffer_pb2_grpc.BufferStub(channel(address["buffer"])).Stats(
        buffer_pb2.BufferStatsRequest(), timeout=10)
    relay = relay_pb2_grpc.RelayStub(channel(address["relay"])).ListVersions(
        relay_pb2.ListVersionsRequest(), timeout=10)
    trainer = trainer_pb2_grpc.TrainerStub(channel(address["trainer"])).Status(
        trainer_pb2.TrainerStatusRequest(), timeout=10)
    worker = rollout_pb2_grpc.RolloutStub(channel(address["rollout-0"])).Status(
        rollout_pb2.RolloutStatusRequest(), timeout=10)
    r = connect(cfg.redis.url)  # with the run's Redis password, if it has one
    # a string's bit count too: the prompt ledger's bitmaps (relayrl.contracts.ledger) are strings
    sizes = {"stream": r.xlen, "hash": r.hlen, "list": r.llen, "set": r.scard, "zset": r.zcard,
             "string": lambda key: (r.strlen(key), r.bitcount(key))}
    keys = {}
    for key in r.scan_iter(count=1000):
        kind = r.type(key).decode()
        keys[key] = (kind, sizes[kind](key) if kind in sizes else None)
    # the stack's own workers rewrite their versions by heartbeat at any moment (after a
    # drawn Heartbeat in their name, too), so only the versions of other names must hold
    live = {c.name for c in launcher.children if c.name.startswith("rollout-")}
    versions = {k: v for k, v in sched.worker_versions.items() if k not in live}
    return {
        "scheduler": (sched.handed_out, sched.leases_granted, sched.leases_completed,
                      sched.leases_expired, sched.active_leases, sched.failed, sched.finished,
                      sched.workers, versions, sched.partial_groups,
                      dict(sched.worker_leases), sched.leases_released, sched.leases_recalled),
        "buffer": (buf.samples_read, buf.groups_assembled, buf.groups_duplicate,
                   buf.batches_emitted, buf.partial_groups, buf.ready_groups,
                   buf.trajectory_stream_len, buf.batch_stream_len, buf.groups_submitted),
        "relay": (list(relay.versions), relay.pending_version, relay.versions_published),
        "trainer": (trainer.step, trainer.version, trainer.samples_trained),
        "rollout": (worker.policy_version, worker.samples_generated, worker.weight_swaps,
                    worker.segments, worker.groups_resumed, worker.leases_released),
        "redis": keys,
    }


def call(ch: grpc.Channel, path: str, method, request, reply_cls):
    serialize = dict(request_serializer=lambda m: m.SerializeToString(),
                     response_deserializer=reply_cls.FromString)
    if method.client_streaming:
        return ch.stream_unary(path, **serialize)(iter(request), timeout=10)
    if method.server_streaming:
        return list(ch.unary_stream(path, **serialize)(request, timeout=10))
    return ch.unary_unary(path, **serialize)(request, timeout=10)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    data = small_stack_config(tmp_path_factory.mktemp("wrong"), steps=1000)
    data["scheduler"]["start_after_workers"] = 99  # no lease is ever granted: the run idles
    launcher = Launcher(RunConfig.model_validate(data), show_trainer_output=False)
    launcher.start()
    wait_until_settled(launcher)
    yield launcher
    launcher.shutdown()


def methods():
    for name, module in MODULES.items():
        (service,) = module.DESCRIPTOR.services_by_name.values()
        for method in service.methods:
            yield name, module, service, method


@pytest.mark.parametrize("name,module,service,method", list(methods()),
                         ids=lambda x: getattr(x, "name", None) if hasattr(x, "full_name")
                         else x if isinstance(x, str) else "")
def test_a_refused_message_names_the_problem_and_changes_nothing(stack, name, module,
                                                                 service, method):
    child = next(c for c in stack.children if c.name == name)
    cls = getattr(module, method.input_type.name)
    path = f"/{service.full_name}/{method.name}"
    reply_cls = getattr(module, method.output_type.name)
    outcomes = {"ok": 0, "declined": 0, "refused": 0}
    requests = message_dicts(cls.DESCRIPTOR)
    if method.client_streaming:
        requests = st.lists(requests, min_size=1, max_size=3)

    with channel(child.address) as ch:
        @settings(max_examples=PER_METHOD, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(drawn=requests)
        def one(drawn):
            request = ([build(cls, d) for d in drawn] if method.client_streaming
                       else build(cls, drawn))
            before = state(stack)
            try:
                reply = call(ch, path, method, request, reply_cls)
            except grpc.RpcError as err:
                assert err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN,
                                          grpc.StatusCode.INTERNAL), (path, err)
                assert err.details(), (path, err)
                assert state(stack) == before, (path, request, err.details())
                outcomes["refused"] += 1
            else:
                # a reply that declines (an unknown or lapsed lease) must change nothing either
                declined = any(getattr(reply, f, True) is False for f in ("accepted", "known"))
                if declined:
                    assert state(stack) == before, (path, request, reply)
                outcomes["declined" if declined else "ok"] += 1

        one()
    assert child.proc.poll() is None, f"{name} died"
    assert check_health(child.address, 5.0), f"{name} stopped serving"
    print(f"{path}: {sum(outcomes.values())} inputs, {outcomes}")


class LostReply(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "the reply was lost on its way back"


class LoseFirstReply(grpc.UnaryUnaryClientInterceptor):
    """The network between an agent and the buffer: the first call reaches the buffer and
    completes there, but its reply never arrives."""

    def __init__(self):
        self.calls = 0

    def intercept_unary_unary(self, continuation, details, request):
        self.calls += 1
        outcome = continuation(details, request)
        outcome.result()  # done on the server
        if self.calls == 1:
            raise LostReply()
        return outcome


def test_submit_checks_the_model_and_a_retry_after_a_lost_reply_appends_once(stack):
    """The real buffer learned the tiny model's vocabulary (15 ids) and context (256 tokens)
    from the config.json `relayrl up` prepared: a group naming token 1000, a reward of 3e38 or
    300 prompt tokens is refused by name and changes nothing. Then an agent's client
    (relayrl.plugins.buffer_client) whose first reply is lost retries with the same request_id, and
    the group goes in once. Runs last: the group it submits stays in the idle stack."""
    address = stack.cfg.buffer.endpoint.address
    size = stack.cfg.buffer.group_size

    def trajectory(**kw):
        base = dict(prompt_tokens=[1, 5, 11], response_tokens=[6, 7, 2],
                    logprobs=[-0.5] * 3, versions=[0] * 3, reward=1.0, finish_reason="stop")
        return buffer_pb2.Trajectory(**{**base, **kw})

    refusals = [
        (trajectory(response_tokens=[6, 7, 1000]), "SubmitRequest.trajectories[1]."
         "response_tokens[2]: token id 1000 is outside the model's vocabulary [0, 15)"),
        (trajectory(reward=3e38), "SubmitRequest.trajectories[1].reward: 3e+38 is outside "
         "task.reward_range [0, 1]"),
        (trajectory(prompt_tokens=[1] * 300), "SubmitRequest.trajectories[1]: "
         "prompt_tokens (300) + response_tokens (3) = 303 tokens, over the model's "
         "context length 256"),
    ]
    with channel(address) as ch:
        stub = buffer_pb2_grpc.BufferStub(ch)
        before = state(stack)
        for bad, message in refusals:
            group = [trajectory(), bad, *[trajectory()] * (size - 2)]
            with pytest.raises(grpc.RpcError) as err:
                stub.Submit(buffer_pb2.SubmitRequest(trajectories=group), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in err.value.details()
        assert state(stack) == before
        stats = stub.Stats(buffer_pb2.BufferStatsRequest(), timeout=10)

        lossy = LoseFirstReply()
        reply = submit_group(buffer_pb2_grpc.BufferStub(grpc.intercept_channel(ch, lossy)),
                             [trajectory(reward=float(i % 2)) for i in range(size)],
                             source="lossy-agent", timeout_s=10)
        after = stub.Stats(buffer_pb2.BufferStatsRequest(), timeout=10)
    assert lossy.calls == 2 and reply.prompt_id > EXTERNAL_PROMPT_BASE
    assert after.groups_submitted == stats.groups_submitted + 1
    assert after.submits_repeated == stats.submits_repeated + 1
    assert after.trajectory_stream_len == stats.trajectory_stream_len + size  # not batched yet
    taken = connect(stack.cfg.redis.url).get(RunKeys(stack.cfg.run_id).external_ids)
    assert EXTERNAL_PROMPT_BASE + int(taken) == reply.prompt_id  # the retry took no id
