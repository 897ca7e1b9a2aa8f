"""The example agent plays a group again when the buffer refuses it as stale, and gives up
after STALE_TRIES; any other refusal is raised at once."""

import importlib.util
from pathlib import Path

import grpc
import pytest

spec = importlib.util.spec_from_file_location(
    "chain_agent", Path(__file__).resolve().parents[2] / "examples/agent/chain_agent.py")
agent = importlib.util.module_from_spec(spec)
spec.loader.exec_module(agent)


class Refused(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return f"refused: {self._code.name}"


class Episodes:
    plays = 0

    def group(self, a, b, c, size):
        self.plays += 1
        return [agent.buffer_pb2.Trajectory(reward=float(self.plays))] * size


class Buffer:
    def __init__(self, refusals):
        self.refusals = list(refusals)

    def Submit(self, request, metadata, timeout):  # noqa: N802 (the gRPC stub's name)
        if self.refusals:
            raise Refused(self.refusals.pop(0))
        return agent.buffer_pb2.SubmitResponse(prompt_id=-7)


def test_a_stale_group_is_played_again_and_the_fresh_one_submitted():
    episodes = Episodes()
    stale = grpc.StatusCode.FAILED_PRECONDITION
    trajs, resp = agent.play_and_submit(episodes, Buffer([stale, stale]), [], 1, 2, 3, 2)
    assert episodes.plays == 3 and trajs[0].reward == 3.0 and resp.prompt_id == -7


def test_it_gives_up_after_its_tries_and_raises_other_refusals_at_once():
    episodes = Episodes()
    stale = [grpc.StatusCode.FAILED_PRECONDITION] * agent.STALE_TRIES
    with pytest.raises(grpc.RpcError):
        agent.play_and_submit(episodes, Buffer(stale), [], 1, 2, 3, 2)
    assert episodes.plays == agent.STALE_TRIES
    episodes = Episodes()
    with pytest.raises(grpc.RpcError):
        agent.play_and_submit(episodes, Buffer([grpc.StatusCode.INVALID_ARGUMENT]), [],
                              1, 2, 3, 2)
    assert episodes.plays == 1
