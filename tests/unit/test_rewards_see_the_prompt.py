"""Rewards see what TRL's reward functions see: the prompt (text or chat messages), each
completion's whole conversation, and every field of the record — per completion and
batched, and through weighted sums and `module:function` specs alike."""

from __future__ import annotations

from relayrl_tasks.episodes.reward import conversation
from relayrl_tasks.rewards import score, score_group, weighted
from relayrl_tasks.rewards.calling import conversation_of

CHAT = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"})


def test_a_per_completion_reward_gets_the_prompt_and_its_conversation():
    seen = []

    def reward(completion, prompt, conversation, metadata):
        seen.append((prompt, conversation, dict(metadata)))
        return float(completion == "4")

    scores = score_group(reward, ["4", "5"], "4", {"question": "2+2?", "answer": "4"},
                         prompt=CHAT)
    assert scores == [(1.0, ""), (0.0, "")]
    prompt, conv, record = seen[0]
    assert prompt == CHAT and record == {"question": "2+2?", "answer": "4"}
    assert conv == (*CHAT, {"role": "assistant", "content": "4"})
    assert seen[1][1][-1] == {"role": "assistant", "content": "5"}


def test_a_batched_reward_gets_prompts_and_conversations_as_trl_passes_them():
    def reward(completions, prompts, conversations, **kwargs):
        assert prompts == ["What is 2+2?"] * len(completions)
        assert kwargs["prompt"] == "What is 2+2?" and kwargs["reference"] == "4"
        assert [c[-1]["content"] for c in conversations] == completions
        assert conversations[0][0] == {"role": "user", "content": "What is 2+2?"}
        return [float(c == "4") for c in completions]

    assert score_group(reward, ["4", "3"], "4", prompt="What is 2+2?") == [(1.0, ""),
                                                                         (0.0, "")]


def test_a_multi_turn_conversation_reaches_the_reward_whole():
    messages = [*CHAT, {"role": "assistant", "content": "<calc>2+2</calc>"},
                {"role": "user", "content": "4"}]
    whole = conversation(messages, "The answer is 4")
    assert whole == [*messages, {"role": "assistant", "content": "The answer is 4"}]
    assert conversation(whole, "The answer is 4") == whole  # already there: not twice

    def turns(completion, conversation):
        return float(sum(m["role"] == "assistant" for m in conversation))

    assert score(turns, "The answer is 4", "", prompt=CHAT, conversation=whole) == (2.0, "")


def test_weighted_sums_pass_what_their_terms_ask_for():
    def mentions(completion, prompt):
        return float(prompt[-1]["content"].rstrip("?") in completion)

    combined = weighted((1.0, mentions), (0.5, lambda c, r: float(c.endswith(r))))
    assert score(combined, "2+2 = 4", "4", prompt=CHAT) == (1.5, "")


def test_a_text_prompt_opens_the_conversation_as_a_user_message():
    assert conversation_of("hi", "hello") == ({"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "hello"})
