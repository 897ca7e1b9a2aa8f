import math

import pytest
import torch

from trainer_svc.parity import logprob_gaps

pytestmark = pytest.mark.unit


def test_identical_logprobs_have_no_gap():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = logprob_gaps(logp, logp.clone(), mask, torch.tensor([[3, 3, -1]]), version=3)
    assert out["rollout/engine_logp_absdiff"] == 0.0
    assert out["rollout/engine_kl"] == 0.0
    assert out["rollout/engine_tokens_frac"] == 1.0


def test_gaps_split_current_version_tokens_from_stale_ones():
    trainer = torch.tensor([[-1.0, -1.0, -1.0, -9.0]])
    engine = torch.tensor([[-1.1, -1.0, -2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last position is not a policy token
    versions = torch.tensor([[5, 5, 4, 5]])
    out = logprob_gaps(trainer, engine, mask, versions, version=5)
    assert out["rollout/engine_tokens_frac"] == pytest.approx(2 / 3)
    assert out["rollout/engine_logp_absdiff"] == pytest.approx(0.05)
    k3 = lambda lr: math.exp(lr) - 1 - lr  # noqa: E731
    assert out["rollout/engine_kl"] == pytest.approx(k3(0.1) / 2, rel=1e-4)
    assert out["rollout/offpolicy_logp_absdiff"] == pytest.approx(1.1 / 3)
    assert out["rollout/offpolicy_kl"] == pytest.approx((k3(0.1) + k3(1.0)) / 3, rel=1e-4)


def test_no_current_version_tokens_reports_only_the_offpolicy_gap():
    logp = torch.zeros((1, 2))
    out = logprob_gaps(logp, logp - 0.5, torch.ones((1, 2)), torch.tensor([[1, 2]]), version=7)
    assert "rollout/engine_logp_absdiff" not in out
    assert out["rollout/engine_tokens_frac"] == 0.0
    assert out["rollout/offpolicy_kl"] > 0


def test_no_policy_tokens_reports_nothing():
    logp = torch.zeros((1, 2))
    assert logprob_gaps(logp, logp, torch.zeros((1, 2)), torch.zeros((1, 2)), version=0) == {}
