"""verifiers environments for the adapter's unit tests, one per `case` of load_environment."""

import verifiers as vf
from datasets import Dataset

ROWS = [{"question": f"{i} + 1?", "answer": str(i + 1)} for i in range(20)]


class Echo(vf.MultiTurnEnv):
    """Answers every reply with 'again: <reply>'; the rubric scores the last reply."""
    async def env_response(self, messages, state, **kwargs):
        return [vf.UserMessage(content=f"again: {messages[-1].content}")]

    @vf.stop
    async def right(self, state, **kwargs) -> bool:
        turns = state["trajectory"]
        return bool(turns) and turns[-1]["completion"][-1].content == state["answer"]


class Raises(Echo):
    async def env_response(self, messages, state, **kwargs):
        raise KeyError("the environment's own bug")


class OwnLoop(vf.Environment):
    """An environment with a rollout loop of its own, not MultiTurnEnv's."""
    async def rollout(self, input, client, model, sampling_args=None):
        raise NotImplementedError


def exact(completion, answer, **kwargs) -> float:
    return float(completion[-1]["content"] == answer)


def add(a: int, b: int) -> int:
    """Add.

    Args:
        a: a
        b: b
    """
    return a + b


def load_environment(case: str = "echo", max_turns: int = 5):
    rubric = vf.Rubric(funcs=[exact])
    if case == "echo":
        return Echo(dataset=Dataset.from_list(ROWS), rubric=rubric, max_turns=max_turns)
    if case == "no_answer":
        rows = [{"question": r["question"]} for r in ROWS]
        return Echo(dataset=Dataset.from_list(rows), rubric=rubric, max_turns=max_turns)
    if case == "with_eval":
        return Echo(dataset=Dataset.from_list(ROWS), eval_dataset=Dataset.from_list(ROWS[:3]),
                    rubric=rubric, max_turns=max_turns)
    if case == "raises":
        return Raises(dataset=Dataset.from_list(ROWS), rubric=rubric)
    if case == "tools":
        return vf.ToolEnv(tools=[add], dataset=Dataset.from_list(ROWS), rubric=rubric)
    if case == "broken":
        raise RuntimeError("cannot build")
    return OwnLoop(dataset=Dataset.from_list(ROWS), rubric=rubric)
