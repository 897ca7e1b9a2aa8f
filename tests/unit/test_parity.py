import math
import os
from types import SimpleNamespace

import pytest
import torch

from trainer_svc.parity import logprob_gaps

pytestmark = pytest.mark.unit


def test_identical_logprobs_have_no_gap():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = logprob_gaps(logp, logp.clone(), mask, torch.tensor([[3, 3, -1]]), version=3)
    assert out["engine_logp_absdiff"] == 0.0
    assert out["engine_kl"] == 0.0
    assert out["engine_tokens_frac"] == 1.0


def test_gaps_split_current_version_tokens_from_stale_ones():
    trainer = torch.tensor([[-1.0, -1.0, -1.0, -9.0]])
    engine = torch.tensor([[-1.1, -1.0, -2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last position is not a policy token
    versions = torch.tensor([[5, 5, 4, 5]])
    out = logprob_gaps(trainer, engine, mask, versions, version=5)
    assert out["engine_tokens_frac"] == pytest.approx(2 / 3)
    assert out["engine_logp_absdiff"] == pytest.approx(0.05)
    k3 = lambda lr: math.exp(lr) - 1 - lr  # noqa: E731
    assert out["engine_kl"] == pytest.approx(k3(0.1) / 2, rel=1e-4)
    assert out["offpolicy_logp_absdiff"] == pytest.approx(1.1 / 3)
    assert out["offpolicy_kl"] == pytest.approx((k3(0.1) + k3(1.0)) / 3, rel=1e-4)


def test_no_current_version_tokens_reports_only_the_offpolicy_gap():
    logp = torch.zeros((1, 2))
    out = logprob_gaps(logp, logp - 0.5, torch.ones((1, 2)), torch.tensor([[1, 2]]), version=7)
    assert "engine_logp_absdiff" not in out
    assert out["engine_tokens_frac"] == 0.0
    assert out["offpolicy_kl"] > 0


def test_no_policy_tokens_reports_nothing():
    logp = torch.zeros((1, 2))
    assert logprob_gaps(logp, logp, torch.zeros((1, 2)), torch.zeros((1, 2)), version=0) == {}


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        tie_word_embeddings=True))


def test_older_tokens_are_rescored_under_their_own_version():
    import copy

    from trainer_svc.batching import token_logprobs
    from trainer_svc.parity import VersionHistory, rescore_older_tokens

    model = tiny_llama()
    v5 = copy.deepcopy(model)
    history = VersionHistory(keep=2)
    history.remember(5, model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)  # version 6
    ids = torch.randint(0, 16, (3, 6))
    batch = SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids),
                            routes=torch.zeros((*ids.shape, 0, 0), dtype=torch.int16))
    mask = torch.ones((3, 5))
    versions = torch.tensor([[5] * 5, [6] * 5, [5, 5, 6, 6, 6]])
    logp, scored = rescore_older_tokens(model, history, ids, batch.attention_mask, mask,
                                        versions, temperature=1.0, max_seqs=8)
    expected = token_logprobs(v5, batch, 1.0).detach()
    assert torch.equal(scored, (versions == 5).float())
    assert torch.allclose(logp[scored > 0], expected[scored > 0], atol=1e-5)
    assert not torch.allclose(expected, token_logprobs(model, batch, 1.0).detach(), atol=1e-3)

    _, scored = rescore_older_tokens(model, history, ids, batch.attention_mask, mask,
                                     versions, temperature=1.0, max_seqs=1)
    assert scored.any(-1).sum() == 1  # the budget is in sequences

    current = token_logprobs(model, batch, 1.0).detach()
    engine = torch.where(versions == 5, expected, current)  # a perfect engine
    out = logprob_gaps(current, engine, mask, versions, 6, (logp, (versions == 5).float()))
    assert out["engine_tokens_frac"] == 1.0
    assert out["engine_logp_absdiff"] < 1e-5
    assert out["offpolicy_logp_absdiff"] > 1e-3


def test_history_keeps_the_newest_versions_in_reused_buffers():
    from trainer_svc.parity import VersionHistory

    model = tiny_llama()
    history = VersionHistory(keep=2)
    for v in (1, 2, 3):
        history.remember(v, model)
    assert history.versions == [2, 3] and history.get(1) is None
    assert VersionHistory(keep=0).versions == []
    history.remember(3, model)  # the same version again keeps one slot
    assert history.versions == [2, 3]


def test_a_version_published_through_shared_memory_is_read_from_its_file(tmp_path):
    """A float32 version staged into a handoff file is kept by viewing that file (no copy of
    its own), re-scores as the copy would, and is let go (file and lock) when evicted; a
    version whose file holds other dtypes is copied."""
    import copy

    from relayrl_torch.weights.shm_handoff import StagedVersion
    from relayrl_torch.weights.tied import without
    from trainer_svc.batching import token_logprobs
    from trainer_svc.parity import VersionHistory, rescore_older_tokens

    model = tiny_llama()
    v5 = copy.deepcopy(model)

    def staged(version, dtype=None):
        state = without(model.state_dict(), {"lm_head.weight": "model.embed_tokens.weight"})
        return StagedVersion.write(str(tmp_path), version, version, state, dtype)

    history = VersionHistory(keep=1)
    five = staged(5)
    history.remember(5, model, five)
    assert history.copies == 0
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)
    ids = torch.randint(0, 16, (1, 6))
    mask, versions = torch.ones((1, 5)), torch.full((1, 5), 5)
    logp, scored = rescore_older_tokens(model, history, ids, torch.ones_like(ids), mask,
                                        versions, temperature=1.0, max_seqs=1)
    batch = SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids),
                            routes=torch.zeros((*ids.shape, 0, 0), dtype=torch.int16))
    assert scored.all()
    assert torch.allclose(logp, token_logprobs(v5, batch, 1.0).detach(), atol=1e-5)

    history.remember(6, model, staged(6, torch.bfloat16))  # not the trained dtype: copied
    assert history.versions == [6] and history.copies == 1
    assert not os.path.exists(five.path) and five._fd is None  # version 5 let go
    assert os.listdir(tmp_path) == []  # 6's file too: it was released at once
    history.close()
