"""A fuzz client against the real stack: every gRPC method of every service gets random,
truncated, oversized and wrongly-typed payloads. No process may die or stop serving, and
every refusal is a status with a message, and bytes that are no message of the method's
request type are refused as INVALID_ARGUMENT naming the method and the type (not gRPC's
generic INTERNAL). Counts of inputs per method are printed."""

import random

import grpc
import pytest
from google.protobuf.message import DecodeError

from relayrl.config import RunConfig
from relayrl.contracts.proto.v1 import (
    buffer_pb2,
    relay_pb2,
    rollout_pb2,
    scheduler_pb2,
    trainer_pb2,
)
from relayrl.runtime.grpc_util import channel, check_health
from relayrl_ops.launcher import Launcher
from tests.conftest import small_stack_config

MODULES = {"buffer": buffer_pb2, "relay": relay_pb2, "scheduler": scheduler_pb2,
           "trainer": trainer_pb2, "rollout-0": rollout_pb2}
PER_METHOD = 24


def payloads(rng: random.Random, method) -> list[bytes]:
    """Random bytes of many sizes, a valid message of another method (wrong type), the
    same truncated, and one larger than the servers accept."""
    other = scheduler_pb2.SaveProgressRequest(worker_id="x" * 40, lease_id="L1",
                                              state=bytes(range(256)) * 4).SerializeToString()
    out = [b"", other, other[: len(other) // 2], b"\xff" * 7]
    while len(out) < PER_METHOD - 1:
        out.append(rng.randbytes(rng.choice([1, 3, 17, 64, 512, 4096])))
    out.append(rng.randbytes(80 << 20))  # past the 64 MiB message limit
    return out


def decodes(cls, payload: bytes) -> bool:
    try:
        cls.FromString(payload)
    except DecodeError:
        return False
    return True


def call(ch: grpc.Channel, path: str, method, payload: bytes):
    identity = dict(request_serializer=None, response_deserializer=None)
    if method.client_streaming:
        fn = ch.stream_unary(path, **identity)
        return fn(iter([payload, payload]), timeout=10)
    if method.server_streaming:
        return list(ch.unary_stream(path, **identity)(payload, timeout=10))
    return ch.unary_unary(path, **identity)(payload, timeout=10)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    data = small_stack_config(tmp_path_factory.mktemp("fuzz"), steps=1000)
    data["scheduler"]["start_after_workers"] = 99  # no lease is ever granted: the run idles
    cfg = RunConfig.model_validate(data)
    launcher = Launcher(cfg, show_trainer_output=False)
    launcher.start()
    yield launcher
    launcher.shutdown()


def test_no_malformed_input_kills_or_stops_a_service(stack):
    rng = random.Random(0)
    tried: dict[str, int] = {}
    undecodable = 0
    for child in stack.children:
        module = MODULES.get(child.name)
        if module is None:
            continue
        (service,) = module.DESCRIPTOR.services_by_name.values()
        with channel(child.address, max_message_bytes=128 << 20) as ch:  # with the token
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                cls = getattr(module, method.input_type.name)
                for payload in payloads(rng, method):
                    try:
                        call(ch, path, method, payload)
                    except grpc.RpcError as err:
                        assert err.code() is not None and err.details(), (path, err)
                        assert err.code() != grpc.StatusCode.UNAVAILABLE, (path, err)
                        if len(payload) <= 64 << 20 and not decodes(cls, payload):
                            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (path, err)
                            assert err.details().startswith(
                                f"{path}: the request is not a valid "
                                f"{method.input_type.full_name}"), (path, err)
                            undecodable += 1
                    else:
                        assert decodes(cls, payload), (path, "undecodable bytes answered OK")
                    tried[path] = tried.get(path, 0) + 1
        assert child.proc.poll() is None, f"{child.name} died"
        assert check_health(child.address, 5.0), f"{child.name} stopped serving"
    print("inputs tried per method:", tried, "undecodable refused:", undecodable)
    assert len(tried) >= 18 and all(n == PER_METHOD for n in tried.values())
    assert undecodable >= len(tried)  # b"\xff" * 7 at least, on every method
