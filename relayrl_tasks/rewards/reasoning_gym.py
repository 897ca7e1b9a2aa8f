"""The `reasoning_gym` reward: a reasoning-gym generator's own scorer
(relayrl_tasks.tasks.reasoning_gym
hands out the problems, with the generator's entry as the metadata this reads)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from relayrl.plugins.rewards.registry import register


@register("reasoning_gym", requires=(("reasoning_gym", "reasoning-gym==0.1.25"),))
def reasoning_gym_reward(completion: str, reference: str, metadata: Mapping[str, Any]) -> float:
    """The generator's own scorer on the completion's <answer> (or the whole completion)."""
    from reasoning_gym import get_score_answer_fn
    from reasoning_gym.utils import extract_answer

    inner = metadata.get("metadata")
    if not isinstance(inner, Mapping) or not isinstance(inner.get("source_dataset"), str):
        raise ValueError("reasoning_gym: the problem's metadata names no source_dataset")
    answer = extract_answer(completion)
    entry = {"question": metadata.get("question", ""), "answer": reference,
             "metadata": dict(inner)}
    scorer = get_score_answer_fn(inner["source_dataset"])
    return float(scorer(answer if answer is not None else completion.strip(), entry))
