"""The example's reward, named in own_task.yaml as `examples.own_task.reward:correct`: the
final number of the completion against the reference, plus a small bonus for answering
briefly (the record's other columns arrive as `metadata`)."""

from relayrl.rewards import math_verify


def correct(completion: str, reference: str, metadata: dict) -> float:
    brief = 0.1 if len(completion) <= 4 * len(metadata["expression"]) else 0.0
    return math_verify(completion, reference) + brief
