"""Multi-digit addition: `12+34=` -> `46`. Exact answers make the reward a checker."""

from __future__ import annotations

from functools import cached_property

import numpy as np

from relayrl.config import AdditionTaskConfig, ConfigError
from relayrl.plugins.tasks.problem import Problem

CHAT_QUESTION = "What is {a}+{b}? Reply with the number only."


class AdditionTask:
    """The built-in task: sums of random numbers, generated from the seed."""
    alphabet = AdditionTaskConfig.ALPHABET

    def __init__(self, digits: int, seed: int, eval_size: int, prompt_format: str = "raw",
                 reward: str | None = None):
        if digits < 1:
            raise ConfigError(f"task.digits must be >= 1, got {digits}")
        space = (10**digits) ** 2
        if eval_size > space // 4:
            raise ConfigError(
                f"task.eval_size {eval_size} is over a quarter of the {space} problems")
        self.digits = digits
        self.seed = seed
        self.eval_size = eval_size
        self.prompt_format = prompt_format
        self.reward_name = reward or ("exact_match" if prompt_format == "raw" else "math_verify")

    @property
    def max_answer_tokens(self) -> int:
        """Longest answer plus the end-of-sequence token."""
        return len(str(2 * (10**self.digits - 1))) + 1

    def _operands(self, rng: np.random.Generator) -> tuple[int, int]:
        hi = 10**self.digits
        a, b = rng.integers(0, hi, size=2)
        return int(a), int(b)

    def _problem(self, prompt_id: int, a: int, b: int) -> Problem:
        if self.prompt_format == "raw":
            return Problem(prompt_id=prompt_id, text=f"{a}+{b}=", reference=str(a + b))
        question = {"role": "user", "content": CHAT_QUESTION.format(a=a, b=b)}
        return Problem(prompt_id=prompt_id, text="", reference=str(a + b),
                       messages=(question,))

    @cached_property
    def _held_out(self) -> list[tuple[int, int]]:
        rng = np.random.default_rng([self.seed, 1])
        pairs: dict[tuple[int, int], None] = {}
        while len(pairs) < self.eval_size:
            pairs[self._operands(rng)] = None
        return list(pairs)

    @cached_property
    def _held_out_set(self) -> frozenset[tuple[int, int]]:
        return frozenset(self._held_out)

    def problem(self, prompt_id: int) -> Problem:
        """The training stream: deterministic per id, never a held-out problem."""
        if prompt_id < 0:
            raise ValueError(f"prompt_id must be >= 0, got {prompt_id}")
        rng = np.random.default_rng([self.seed, 0, prompt_id])
        while True:
            a, b = self._operands(rng)
            if (a, b) not in self._held_out_set:
                return self._problem(prompt_id, a, b)

    def eval_problems(self) -> list[Problem]:
        """The held-out problems, never handed out for training (negative ids)."""
        return [self._problem(-1 - i, a, b) for i, (a, b) in enumerate(self._held_out)]
