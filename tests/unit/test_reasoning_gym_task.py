"""reasoning-gym tasks: deterministic problems by id, held-out ones never trained on, and the
generator's own scorer as the reward (relayrl_tasks/tasks/reasoning_gym.py)."""

import pytest

from relayrl.config import ReasoningGymTaskConfig
from relayrl_tasks.rewards import get_reward
from relayrl_tasks.tasks import make_task

pytestmark = pytest.mark.unit


def rg_task(**fields):
    return make_task(ReasoningGymTaskConfig(generator="basic_arithmetic", size=50,
                                            eval_size=20, **fields))


def test_problems_are_a_pure_function_of_the_id_and_epochs_differ():
    a, b = rg_task(seed=3), rg_task(seed=3)
    assert [a.problem(i) for i in (0, 49, 50, 7)] == [b.problem(i) for i in (0, 49, 50, 7)]
    assert a.problem(0).metadata["question"] != a.problem(50).metadata["question"]
    held = {p.metadata["question"] for p in a.eval_problems()}
    assert len(held) == 20
    assert not held & {a.problem(i).metadata["question"] for i in range(200)}


def test_the_prompt_asks_for_answer_tags_and_the_scorer_reads_them():
    task = rg_task()
    p = task.problem(4)
    assert p.messages[0]["role"] == "system" and "<answer>" in p.messages[0]["content"]
    assert p.messages[-1]["content"] == p.metadata["question"]
    reward = get_reward(task.reward_name)
    from relayrl_tasks.rewards import score

    right = f"thinking... <answer>{p.reference}</answer>"
    assert score(reward, right, p.reference, metadata=p.metadata) == (1.0, "")
    assert score(reward, "<answer>nope</answer>", p.reference, metadata=p.metadata)[0] == 0.0


def test_bad_generators_and_options_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset 'no_such_task'"):
        make_task(ReasoningGymTaskConfig(generator="no_such_task"))
    with pytest.raises(ValueError, match="task.options: basic_arithmetic refused"):
        rg_task(options={"min_terms": 5, "max_terms": 2})
