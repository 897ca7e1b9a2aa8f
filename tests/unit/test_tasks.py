import pytest

from relayrl.config import AdditionTaskConfig as TaskConfig
from relayrl_tasks.tasks import make_task

pytestmark = pytest.mark.unit


def test_raw_prompts_are_checked_exactly():
    task = make_task(TaskConfig(digits=2))
    p = task.problem(7)
    assert p.text.endswith("=") and p.text[:-1].replace("+", "").isdigit()
    assert task.reward_name == "exact_match"


def test_chat_prompts_ask_a_question_and_read_the_final_number():
    raw, chat = make_task(TaskConfig(digits=2)), make_task(TaskConfig(digits=2,
                                                                       prompt_format="chat"))
    a, b = raw.problem(7).text[:-1].split("+")
    assert chat.problem(7).messages == (
        {"role": "user", "content": f"What is {a}+{b}? Reply with the number only."},)
    assert chat.problem(7).reference == raw.problem(7).reference
    assert chat.reward_name == "math_verify"
    held_out = {p.reference for p in chat.eval_problems()}
    assert len(chat.eval_problems()) == 256 and held_out


def test_reward_spec_overrides_the_default_and_is_checked():
    task = make_task(TaskConfig(prompt_format="chat", reward="math_verify+0.1*format_boxed"))
    assert task.reward_name == "math_verify+0.1*format_boxed"
    with pytest.raises(ValueError, match="task.reward.*unknown reward function 'nope'"):
        make_task(TaskConfig(reward="nope"))
