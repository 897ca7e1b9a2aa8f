"""A real Reward gRPC server on loopback, called through RemoteReward and raw stubs."""

import time
from concurrent import futures

import grpc
import pytest

from relayrl.config.security import AuthConfig
from relayrl.contracts.proto.v1 import reward_pb2, reward_pb2_grpc
from relayrl.runtime import auth
from relayrl.runtime.grpc_util import channel, make_server
from relayrl_tasks.rewards import (
    RemoteReward,
    RemoteRewardError,
    get_reward,
    math_verify,
    score,
    serve_reward_model,
)
from tests.conftest import free_ports


def judge(prompt: str, completion: str, reference: str) -> float:
    """A stand-in reward model: the answer's correctness, plus 0.5 when the prompt asks for
    care; 'explode' in a completion makes it raise for that item only."""
    if "explode" in completion:
        raise RuntimeError("model cannot score this")
    bonus = 0.5 if prompt == "careful" else 0.0
    return math_verify(completion, reference) + bonus


@pytest.fixture
def address():
    (port,) = free_ports(1)
    addr = f"127.0.0.1:{port}"
    server = serve_reward_model(judge, addr, max_batch=8)
    yield addr
    server.stop(0)


def test_scores_a_batch_in_order(address):
    with RemoteReward(address, timeout_s=5) as remote:
        results = remote.score_batch(
            ["it is 4", "\\boxed{3/4}", "7"], ["4", "0.75", "8"], ["", "careful", ""])
        assert results == [(1.0, ""), (1.5, ""), (0.0, "")]
        assert remote.score_batch(["1,234"], ["1234"]) == [(1.0, "")]  # prompts may be left out


def test_an_item_that_raises_reports_its_own_error_only(address):
    with RemoteReward(address, timeout_s=5) as remote:
        results = remote.score_batch(["4", "explode", "5"], ["4", "4", "4"])
        assert results[0] == (1.0, "") and results[2] == (0.0, "")
        assert results[1] == (0.0, "RuntimeError: model cannot score this")
        # as a reward function, the item's error raises, and score() records it
        assert score(remote, "explode", "4") == (
            0.0, f"RemoteRewardError: remote:{address}: RuntimeError: model cannot score this")
        assert score(remote, "so 4", "4") == (1.0, "")


@pytest.mark.parametrize("request_kw, message", [
    ({"completions": ["a", "b"], "references": ["1"]},
     "references holds 1 items but completions holds 2"),
    ({"completions": ["a"], "references": ["1"], "prompts": ["p", "q"]},
     "prompts holds 2 items but completions holds 1"),
    ({"completions": ["a"] * 9}, "completions holds 9 items, over the limit of 8"),
])
def test_malformed_requests_are_refused_naming_the_field(address, request_kw, message):
    with channel(address) as ch:
        stub = reward_pb2_grpc.RewardStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.Score(reward_pb2.ScoreRequest(**request_kw), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()


def test_a_refused_request_raises_from_the_client(address):
    with RemoteReward(address, timeout_s=5) as remote:
        with pytest.raises(RemoteRewardError, match="INVALID_ARGUMENT: Score: references"):
            remote.score_batch(["a", "b"], ["1"])


def test_a_spec_mixes_remote_and_local_terms(address):
    fn = get_reward(f"remote:{address}+0.1*format_boxed")
    assert fn("\\boxed{6}", "6") == pytest.approx(1.1)


def test_a_down_server_is_an_error_on_the_sample_not_a_crash():
    (port,) = free_ports(1)
    fn = get_reward(f"remote:127.0.0.1:{port}")
    start = time.monotonic()
    reward, error = score(fn, "4", "4")
    assert reward == 0.0
    assert error.startswith(f"RemoteRewardError: remote:127.0.0.1:{port}: UNAVAILABLE")
    assert time.monotonic() - start < 5  # fails fast instead of waiting for the server


def test_a_slow_server_times_out_into_an_error():
    (port,) = free_ports(1)
    server = serve_reward_model(lambda p, c, r: time.sleep(1.0) or 1.0, f"127.0.0.1:{port}")
    try:
        remote = RemoteReward(f"127.0.0.1:{port}", timeout_s=0.2)
        reward, error = score(remote, "4", "4")
        assert reward == 0.0 and "DEADLINE_EXCEEDED" in error
        remote.close()
    finally:
        server.stop(0)


def test_a_huge_remote_reward_is_an_error_on_its_sample():
    """A reward model answering 1e308 (finite, but far past buffer.reward_range) is scored as a
    worker scores it: 0 with the error on the sample, so its group stays trainable."""
    (port,) = free_ports(1)
    server = serve_reward_model(lambda p, c, r: 1e308 if c == "huge" else 1.0,
                                f"127.0.0.1:{port}")
    try:
        with RemoteReward(f"127.0.0.1:{port}", timeout_s=5) as remote:
            assert score(remote, "huge", "", (-1e4, 1e4)) == (
                0.0, "ValueError: reward 1e+308 is outside buffer.reward_range [-10000, 10000]")
            assert score(remote, "fine", "", (-1e4, 1e4)) == (1.0, "")
    finally:
        server.stop(0)


class ShortAnswers(reward_pb2_grpc.RewardServicer):
    """A broken server: one reward whatever the batch, and NaN when asked for 'nan'."""

    def Score(self, request, context):
        reward = float("nan") if request.completions[0] == "nan" else 1.0
        return reward_pb2.ScoreResponse(rewards=[reward], errors=[""])


def test_a_malformed_response_is_an_error():
    (port,) = free_ports(1)
    server, _ = make_server(f"127.0.0.1:{port}",
                            [(reward_pb2_grpc.add_RewardServicer_to_server, ShortAnswers())],
                            credentials=auth.reward_credentials())
    server.start()
    try:
        with RemoteReward(f"127.0.0.1:{port}", timeout_s=5) as remote:
            with pytest.raises(RemoteRewardError, match="bad response: 1 rewards and 1 errors "
                                                        "for 2 items"):
                remote.score_batch(["a", "b"])
            assert score(remote, "nan", "")[1].endswith("bad response: rewards[0] is nan")
    finally:
        server.stop(0)


class Spy(reward_pb2_grpc.RewardServicer):
    """A reward server that records the authorization metadata of every call."""

    def __init__(self):
        self.seen: list[list[str]] = []

    def Score(self, request, context):
        self.seen.append([v for k, v in context.invocation_metadata() if k == "authorization"])
        return reward_pb2.ScoreResponse(rewards=[1.0] * len(request.completions),
                                        errors=[""] * len(request.completions))


@pytest.fixture
def spy():
    (port,) = free_ports(1)
    servicer = Spy()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    reward_pb2_grpc.add_RewardServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(0)


RUN_TOKENS = {"RELAYRL_TOKEN": "run-service-token", "RELAYRL_TRAINER_TOKEN": "run-trainer",
              "RELAYRL_OPERATOR_TOKEN": "run-operator", "RELAYRL_AGENT_TOKEN": "run-agent"}


@pytest.mark.parametrize("installed", [False, True], ids=["from-environment", "installed"])
def test_a_reward_server_never_receives_a_run_token(spy, monkeypatch, installed):
    """A process holding every run token (from the environment, or installed from its
    config as a service does) sends a reward server none of them: nothing without a reward
    token, and the reward token alone with one."""
    address, servicer = spy
    for var, token in RUN_TOKENS.items():
        monkeypatch.setenv(var, token)
    monkeypatch.delenv("RELAYRL_REWARD_TOKEN", raising=False)
    try:
        auth.install(auth.load_credentials(AuthConfig()) if installed else None)
        with RemoteReward(address, timeout_s=5) as remote:
            assert remote.score_batch(["4"], ["4"]) == [(1.0, "")]
        monkeypatch.setenv("RELAYRL_REWARD_TOKEN", "reward-only")
        auth.install(auth.load_credentials(AuthConfig()) if installed else None)
        with get_reward(f"remote:{address}") as remote:
            assert remote.score_batch(["4"], ["4"]) == [(1.0, "")]
    finally:
        auth.install(None)
    assert servicer.seen == [[], ["Bearer reward-only"]]


def test_a_reward_token_equal_to_a_run_token_is_refused(monkeypatch):
    monkeypatch.setenv("RELAYRL_TOKEN", "shared")
    monkeypatch.setenv("RELAYRL_REWARD_TOKEN", "shared")
    with pytest.raises(ValueError, match=r"\$RELAYRL_REWARD_TOKEN \(auth.reward_token_env\) "
                                         r"holds the same token as \$RELAYRL_TOKEN"):
        auth.load_credentials(AuthConfig())


def test_the_reward_server_takes_the_reward_token_alone(monkeypatch):
    """serve_reward_model admits the reward token and refuses the run's."""
    monkeypatch.setenv("RELAYRL_REWARD_TOKEN", "reward-only")
    monkeypatch.setenv("RELAYRL_TOKEN", "run-service-token")
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    server = serve_reward_model(judge, address)
    try:
        with RemoteReward(address, timeout_s=5) as remote:
            assert remote.score_batch(["4"], ["4"]) == [(1.0, "")]
        with channel(address, auth.Credentials(token="run-service-token")) as ch:
            with pytest.raises(grpc.RpcError) as info:
                reward_pb2_grpc.RewardStub(ch).Score(
                    reward_pb2.ScoreRequest(completions=["4"]), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(0)
