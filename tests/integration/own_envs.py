"""An environment a user would write, loaded by `rollout.environment.cls:
tests.integration.own_envs:AskTwice` in tests/integration/test_environment.py."""

import json

from relayrl.plugins.envs import Environment, Step


class AskTwice(Environment):
    """Asks the question again after the first answer, then scores the second: 1 if right.
    Each step is logged as a JSON line to `log`, so the test sees the episodes the workers
    ran."""

    def __init__(self, log: str):
        self.log = log
        self.turn = 0

    def reset(self, problem):
        self.problem = problem
        return None  # the task's own prompt opens the episode

    def step(self, message):
        self.turn += 1
        with open(self.log, "a") as f:
            f.write(json.dumps({"prompt_id": self.problem.prompt_id, "turn": self.turn,
                                "reply": message}) + "\n")
        if self.turn == 1:
            return Step([{"role": "user", "content": self.problem.text}])
        return Step([], float(message.strip() == self.problem.reference), True)
