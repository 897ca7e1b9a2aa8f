"""Rewards a user would write, imported by `task.reward: tests.integration.own_rewards:NAME`
in tests/integration/test_own_task.py."""


def sum_of_operands(completion: str, reference: str, metadata: dict) -> float:
    """1 for the sum of the record's `a` and `b` columns: proves the metadata arrived."""
    return 1.0 if completion.strip() == str(metadata["a"] + metadata["b"]) else 0.0


def group_mean_match(completions: list[str], reference: str) -> list[float]:
    """Batched: every completion of a group at once."""
    return [1.0 if c.strip() == reference else 0.0 for c in completions]
