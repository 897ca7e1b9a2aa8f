"""A verifiers environment written in verifiers' own API, for the adapter's tests: guess the
sum, told to try again until right or out of turns; the rubric scores the last answer and
appends a line per scored episode to `log`."""

import json

import verifiers as vf
from datasets import Dataset


class GuessTheSum(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        return [vf.UserMessage(content="No. Try again.")]

    @vf.stop
    async def answered(self, state, **kwargs) -> bool:
        turns = state["trajectory"]
        return bool(turns) and turns[-1]["completion"][-1].content.strip() == state["answer"]


def load_environment(log: str, n: int = 40) -> vf.Environment:
    rows = [{"question": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)}
            for i in range(n)]

    def right(completion, answer, state, **kwargs) -> float:
        score = 1.0 if completion[-1]["content"].strip() == answer else 0.0
        with open(log, "a") as f:
            f.write(json.dumps({"turns": len(state["trajectory"]), "score": score}) + "\n")
        return score

    return GuessTheSum(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[right]),
                       system_prompt="Answer with the number only.", max_turns=3)
