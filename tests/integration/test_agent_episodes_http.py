"""Episodes recorded by a worker's OpenAI-compatible server, on a real engine through the
official `openai` client: an agent that only tags its requests (X-RelayRL-Episode) and reports
one reward gets its turns submitted as the tokens the model wrote, one group per task, while a
history it edited, a turn past its budget or a second reward is refused by name (another
credential's episode: tests/unit/test_agent_episodes.py)."""

import grpc
import httpx
import openai
import pytest

from relayrl.config.rollout import AgentEpisodesConfig
from relayrl.contracts.proto.v1 import rollout_pb2, rollout_pb2_grpc
from relayrl.runtime import auth
from relayrl.runtime.grpc_util import channel, make_server
from rollout_svc.engines.torch import TorchEngine
from rollout_svc.server import RolloutServicer
from rollout_svc.serving.agent_episodes import AgentEpisodes
from rollout_svc.serving.generator import CustomGenerator
from rollout_svc.serving.openai_server import OpenAIServer
from tests.conftest import free_ports

MODEL = "test-policy"
GROUP = 2


class Buffer:
    """The groups submitted, by request id."""

    def __init__(self):
        self.groups = {}

    def __call__(self, request_id, trajectories):
        self.groups[request_id] = trajectories


@pytest.fixture
def served(chat_lm):
    from relayrl.config import RolloutConfig

    gen = CustomGenerator(TorchEngine(chat_lm, seed=0, version=3), chat_lm,
                          RolloutConfig(max_new_tokens=4, max_prompt_tokens=200))
    buffer = Buffer()
    episodes = AgentEpisodes(GROUP, AgentEpisodesConfig(max_turns=3), (0.0, 1.0), buffer)
    port, grpc_port = free_ports(2)
    server = OpenAIServer(gen, "127.0.0.1", port, MODEL, episodes=episodes)
    server.start()
    rpc, _ = make_server(f"127.0.0.1:{grpc_port}", [(
        rollout_pb2_grpc.add_RolloutServicer_to_server,
        RolloutServicer(None, gen, episodes, auth.current().book is not None))])
    rpc.start()
    server.rpc = rollout_pb2_grpc.RolloutStub(channel(f"127.0.0.1:{grpc_port}"))
    yield server, episodes, buffer
    rpc.stop(0)
    server.stop()


def client(server, episode):
    token = auth.current().token or "unused"
    return openai.OpenAI(base_url=f"{server.address}/v1", api_key=token, max_retries=0,
                         default_headers={"X-RelayRL-Episode": episode})


def reward(server, episode, value):
    """`value` as JSON text, so that a client may send what json.dumps would not (Infinity)."""
    token = auth.current().token or "unused"
    return httpx.post(f"{server.address}/v1/episodes/{episode}/reward",
                      content=f'{{"reward": {value}}}', timeout=30,
                      headers={"Authorization": f"Bearer {token}",
                               "Content-Type": "application/json"})


def play(server, episode, turns=2):
    """An agent as a framework writes it: it keeps messages, never token ids."""
    agent = client(server, episode)
    messages = [{"role": "user", "content": "1+2="}]
    seen = []
    for _ in range(turns):
        resp = agent.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
        seen.append(resp)
        messages += [resp.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": "again"}]
    return messages, seen


def test_a_tagged_agent_s_episodes_are_submitted_as_the_model_wrote_them(served):
    server, episodes, buffer = served
    _, seen = play(server, "ep-1")
    play(server, "ep-2")
    assert reward(server, "ep-1", 1.0).json() == {"episode": "ep-1", "status": "waiting"}
    assert reward(server, "ep-2", 0.0).json()["status"] == "submitted"
    [[first, second]] = buffer.groups.values()
    last = seen[-1]
    whole = last.model_extra["prompt_token_ids"] + last.choices[0].model_extra["token_ids"]
    assert list(first.prompt_tokens) + list(first.response_tokens) == whole
    assert list(first.prompt_tokens) == seen[0].model_extra["prompt_token_ids"]
    policy = sum(len(r.choices[0].model_extra["token_ids"]) for r in seen)
    assert sum(first.loss_mask) == policy < len(first.loss_mask)  # the user's turn is masked
    assert (first.reward, second.reward) == (1.0, 0.0)
    assert episodes.held() == 0


def test_bad_episode_requests_are_refused_by_name(served):
    server, episodes, buffer = served
    messages, _ = play(server, "ep-3")
    edited = [*messages[:1], {"role": "assistant", "content": "something else"}, messages[2]]
    with pytest.raises(openai.APIStatusError) as err:
        client(server, "ep-3").chat.completions.create(model=MODEL, messages=edited,
                                                       max_tokens=4)
    assert err.value.status_code == 409 and "does not extend the episode" in str(err.value)
    with pytest.raises(openai.APIStatusError) as err:
        client(server, "ep-3").chat.completions.create(model=MODEL, messages=messages,
                                                       max_tokens=4, n=2)
    assert err.value.status_code == 400 and "one choice" in str(err.value)
    client(server, "ep-3").chat.completions.create(model=MODEL, messages=messages,
                                                   max_tokens=4)  # its own history goes on
    with pytest.raises(openai.APIStatusError) as err:
        play(server, "ep-4", turns=4)
    assert err.value.status_code == 409 and "max_turns 3" in str(err.value)
    assert reward(server, "nobody", 1.0).status_code == 404
    bad = reward(server, "ep-3", "Infinity")
    assert bad.status_code == 400 and "reward" in bad.text
    assert reward(server, "ep-3", 1.0).json()["status"] == "waiting"
    again = reward(server, "ep-3", 1.0)
    assert again.status_code == 409 and "already rewarded" in again.text
    assert episodes.held() == 2 and not buffer.groups


def test_a_reward_may_come_over_grpc_as_over_http(served):
    server, episodes, buffer = served
    play(server, "ep-5", turns=1)
    play(server, "ep-6", turns=1)
    assert reward(server, "ep-5", 1.0).json()["status"] == "waiting"
    reply = server.rpc.RewardEpisode(rollout_pb2.EpisodeRewardRequest(episode="ep-6",
                                                                     reward=0.5), timeout=30)
    assert (reply.episode, reply.status) == ("ep-6", "submitted") and len(buffer.groups) == 1
    for episode, code, says in (("ep-6", grpc.StatusCode.NOT_FOUND, "no open episode"),
                                ("a b", grpc.StatusCode.INVALID_ARGUMENT, "1 to 128")):
        with pytest.raises(grpc.RpcError) as err:
            server.rpc.RewardEpisode(rollout_pb2.EpisodeRewardRequest(episode=episode,
                                                                     reward=1.0), timeout=30)
        assert err.value.code() == code and says in err.value.details()
        assert err.value.details().startswith("EpisodeRewardRequest.episode")


def test_a_framework_that_sets_no_headers_tags_its_episode_in_metadata(served):
    server, episodes, buffer = served
    plain = openai.OpenAI(base_url=f"{server.address}/v1", max_retries=0,
                          api_key=auth.current().token or "unused")
    for n in range(GROUP):
        plain.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "1="}],
                                      max_tokens=3, metadata={"relayrl_episode": f"m{n}",
                                                              "relayrl_task": "ones"})
    assert episodes.held() == GROUP
    assert [reward(server, f"m{n}", 1.0).json()["status"] for n in range(GROUP)] == [
        "waiting", "submitted"]
    plain.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "1="}],
                                  max_tokens=3)  # untagged: nothing recorded
    assert episodes.held() == 0 and len(buffer.groups) == 1
