"""Temporary: relayrl.rewards.score takes `metadata=` once the rewards change (issue 20) lands;
until then the eval modules' calls go through this shim. Remove with that change."""

import inspect

import pytest

from relayrl import rewards

_NEEDS_SHIM = "metadata" not in inspect.signature(rewards.score).parameters


@pytest.fixture(autouse=True)
def _score_takes_metadata(monkeypatch):
    if _NEEDS_SHIM:
        import relayrl.evals.runner as runner

        original = rewards.score

        def score(fn, completion, reference, reward_range=None, metadata=None):
            return original(fn, completion, reference, reward_range)

        monkeypatch.setattr(runner, "score", score)
    yield
