"""The example's reward, named in own_task.yaml as `examples.own_task.reward:correct`: the
final number of the completion against the reference, plus a small bonus for a right answer
given briefly (the record's other columns arrive as `metadata`). The bonus is only for right
answers: paid for any short reply, it taught the model short wrong ones."""

from relayrl_tasks.rewards import math_verify


def correct(completion: str, reference: str, metadata: dict) -> float:
    right = math_verify(completion, reference)
    brief = len(completion) <= 4 * len(metadata["expression"])
    return right * (1.1 if brief else 1.0)
