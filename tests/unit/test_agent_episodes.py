"""The server's record of agent episodes (rollout_svc.serving.agent_episodes): turns kept as
the model's tokens, groups of one task submitted once when rewarded, and every bad report or
deadline a clear refusal or a counted drop."""

import pytest

from relayrl.config.rollout import AgentEpisodesConfig
from relayrl.plugins.buffer_client import ChatTurn
from rollout_svc.serving.agent_episodes import AgentEpisodes, EpisodeRefused, NotTaken

PROMPT = [1, 2, 3]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Buffer:
    """What the buffer took, by request id; `fail` refusals to come first."""

    def __init__(self, fail: int = 0):
        self.taken: dict[str, list] = {}
        self.calls = 0
        self.fail = fail

    def __call__(self, request_id, trajectories):
        self.calls += 1
        if self.fail:
            self.fail -= 1
            raise ConnectionError("buffer unreachable")
        self.taken.setdefault(request_id, trajectories)


def book(group_size=2, buffer=None, clock=None, **limits):
    return AgentEpisodes(group_size, AgentEpisodesConfig(**limits), (0.0, 1.0),
                         buffer if buffer is not None else Buffer(), clock or Clock())


def play(eps, episode, turns=2, owner="agent-a", task=None, prompt=PROMPT):
    """`turns` turns: each completion two tokens, each tool result one token."""
    context = list(prompt)
    for n in range(turns):
        eps.check(owner, episode, context)
        reply = [10 + n, 20 + n]
        eps.record(owner, episode, task, ChatTurn(context, reply, [-0.5, -0.25], [n, n]),
                   "stop")
        context = context + reply + [99]


def refused(status, field, match, fn, *args):
    with pytest.raises(EpisodeRefused, match=match) as err:
        fn(*args)
    assert (err.value.status, err.value.field) == (status, field)


def test_a_group_of_rewarded_episodes_goes_to_the_buffer_once_as_the_model_wrote_it():
    buffer = Buffer()
    eps = book(buffer=buffer)
    play(eps, "e1")
    play(eps, "e2")
    assert eps.reward("agent-a", "e1", 1.0) == "waiting" and not buffer.taken
    assert eps.reward("agent-a", "e2", 0.0) == "submitted"
    [(request_id, [t1, t2])] = buffer.taken.items()
    assert list(t1.prompt_tokens) == PROMPT
    assert list(t1.response_tokens) == [10, 20, 99, 11, 21]
    assert list(t1.loss_mask) == [1, 1, 0, 1, 1]  # the tool's token is not trained
    assert list(t1.versions) == [0, 0, 0, 1, 1]
    assert (t1.reward, t2.reward) == (1.0, 0.0)
    assert eps.held() == 0 and eps.groups_submitted == 1 and eps.episodes_submitted == 2
    assert len(request_id) == 32


def test_episodes_group_by_task_and_by_credential():
    buffer = Buffer()
    eps = book(buffer=buffer)
    play(eps, "a1")
    play(eps, "b1", prompt=[7, 7])  # another first prompt: another task
    play(eps, "c1", owner="agent-b")  # another credential's episode never joins a's group
    assert [eps.reward(o, e, 1.0) for o, e in
            (("agent-a", "a1"), ("agent-a", "b1"), ("agent-b", "c1"))] == ["waiting"] * 3
    play(eps, "t1", task="sum", prompt=[5])
    play(eps, "t2", task="sum", prompt=[6])  # tagged one task though their prompts differ
    eps.reward("agent-a", "t1", 1.0)
    assert eps.reward("agent-a", "t2", 1.0) == "submitted" and len(buffer.taken) == 1


def test_bad_rewards_are_refused_by_name_and_lose_nothing():
    eps = book()
    play(eps, "e1")
    refused(404, "episode", "'nope': no open episode", eps.reward, "agent-a", "nope", 1.0)
    refused(404, "episode", "'e1': no open episode", eps.reward, "agent-b", "e1", 1.0)
    refused(400, "reward", "must be a finite number", eps.reward, "agent-a", "e1", float("nan"))
    refused(400, "reward", "must be a finite number", eps.reward, "agent-a", "e1", True)
    refused(400, "reward", r"outside the task's reward range \[0, 1\]", eps.reward,
            "agent-a", "e1", 2.0)
    refused(400, "episode", "must be 1 to 128 characters", eps.reward, "agent-a", "a b", 1.0)
    assert eps.reward("agent-a", "e1", 1.0) == "waiting"  # still there after every refusal
    refused(409, "episode", r"already rewarded \(1\)", eps.reward, "agent-a", "e1", 0.5)
    refused(409, "episode", "already rewarded", eps.check, "agent-a", "e1", PROMPT)
    assert eps.refused == {"episode": 5, "reward": 3}


def test_a_credential_past_its_quota_of_open_episodes_is_refused():
    eps = book(max_open=1024)
    for n in range(1024):
        play(eps, f"e{n}", turns=1)
    attempts = 10_000 - 1024
    for n in range(1024, 10_000):
        with pytest.raises(EpisodeRefused) as err:
            eps.check("agent-a", f"e{n}", PROMPT)
        assert err.value.status == 429
    assert "holds 1024 episodes already (rollout.agent_episodes.max_open)" in str(err.value)
    assert eps.refused["episode"] == attempts
    eps.check("agent-a", "e5", PROMPT + [10, 20, 99])  # its own episodes go on
    eps.check("agent-b", "other", PROMPT)  # and another credential has its own quota
    assert eps.held("agent-a") == eps.held() == 1024


def test_an_episode_past_its_turns_is_refused_and_can_still_be_rewarded():
    buffer = Buffer()
    eps = book(group_size=1, buffer=buffer, max_turns=64)
    play(eps, "long", turns=64)
    context = PROMPT + sum(([10 + n, 20 + n, 99] for n in range(64)), [])
    refused(409, "episode", r"64 turns, the most one episode takes \(rollout.agent_episodes."
            "max_turns 64\\)", eps.check, "agent-a", "long", context)
    assert eps.reward("agent-a", "long", 1.0) == "submitted"
    [[t]] = buffer.taken.values()
    assert sum(t.loss_mask) == 128


def test_a_turn_that_does_not_extend_the_episode_is_refused_never_merged():
    eps = book()
    play(eps, "e1")
    refused(409, "messages", "does not extend the episode's 2 turns", eps.check, "agent-a",
            "e1", PROMPT + [10, 21])
    # a turn that raced another of the same episode is not recorded over it
    eps.record("agent-a", "e1", None, ChatTurn([4, 4], [5], [-1.0], [0]), "stop")
    assert eps.turns == 2


def test_deadlines_drop_and_count_what_never_finishes():
    clock = Clock()
    eps = book(clock=clock, idle_s=60, group_wait_s=300)
    play(eps, "idle")
    play(eps, "lonely")
    eps.reward("agent-a", "lonely", 1.0)
    clock.now += 61
    eps.sweep()
    assert eps.dropped == {"idle": 1} and eps.held() == 1
    clock.now += 300
    eps.sweep()
    assert eps.dropped == {"idle": 1, "group_incomplete": 1} and eps.held() == 0
    refused(404, "episode", "no open episode", eps.reward, "agent-a", "idle", 1.0)


def test_a_group_the_buffer_did_not_take_is_retried_under_its_request_id_then_dropped():
    clock, buffer = Clock(), Buffer(fail=2)
    eps = book(buffer=buffer, clock=clock, group_wait_s=300)
    play(eps, "e1")
    play(eps, "e2")
    eps.reward("agent-a", "e1", 1.0)
    assert eps.reward("agent-a", "e2", 1.0) == "queued" and not buffer.taken
    eps.sweep()  # the second refusal
    eps.sweep()
    assert len(buffer.taken) == 1 and eps.groups_submitted == 1 and eps.submit_failures == 2
    lost, never = Clock(), Buffer(fail=10**6)
    eps = book(buffer=never, clock=lost, group_wait_s=300)
    play(eps, "e1")
    play(eps, "e2")
    eps.reward("agent-a", "e1", 1.0)
    eps.reward("agent-a", "e2", 1.0)
    lost.now += 301
    eps.sweep()
    assert eps.dropped == {"not_submitted": 2} and never.calls == 1


def test_a_group_the_buffer_refuses_for_good_is_dropped_and_counted_not_retried():
    calls = []

    def stale(request_id, trajectories):
        calls.append(request_id)
        raise NotTaken("stale", "a token of version 0 is older than the trainer takes")

    eps = book(buffer=stale)
    play(eps, "e1")
    play(eps, "e2")
    eps.reward("agent-a", "e1", 1.0)
    assert eps.reward("agent-a", "e2", 1.0) == "stale"
    eps.sweep()
    assert eps.dropped == {"stale": 2} and len(calls) == 1 and eps.held() == 0
