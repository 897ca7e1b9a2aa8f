"""The output layer run a chunk of positions at a time (trainer_svc.output_layer) against
whole logits: the same log-probabilities, entropies and gradients, on the plain and the
shared-prompt pass; and a model whose logits are more than its output layer (Gemma 2's
soft-cap) keeps the whole-logits path."""

import copy

import pytest
import torch
import transformers

from tests.unit.test_shared_prefix import response_positions, varied_batch
from trainer_svc import output_layer
from trainer_svc.batching import next_token_stats, policy_outputs
from trainer_svc.shared_prefix import prompt_sharing, shared_prefix_outputs


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_chunked_stats_and_gradients_equal_the_whole_log_softmax(monkeypatch, entropy_grad):
    torch.manual_seed(0)
    n, hidden_size, vocabulary = 37, 16, 50
    monkeypatch.setattr(output_layer, "CHUNK_ELEMENTS", 8 * vocabulary)  # 5 chunks
    h0, w0 = torch.randn(n, hidden_size), torch.randn(vocabulary, hidden_size)
    targets = torch.randint(0, vocabulary, (n,))
    weights = torch.randn(n), torch.randn(n)  # of the log-probabilities, of the entropies
    results = []
    for chunked in (False, True):
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        if chunked:
            taken, entropy = output_layer.token_stats(h[None], w, targets[None], 0.7,
                                                      entropy_grad)
        else:
            taken, entropy = next_token_stats((h @ w.T)[None], targets[None], 0.7,
                                              entropy_grad)
        assert entropy.requires_grad == entropy_grad
        loss = (taken[0] * weights[0]).sum()
        if entropy_grad:
            loss = loss + (entropy[0] * weights[1]).sum()
        loss.backward()
        results.append((taken.detach(), entropy.detach(), h.grad, w.grad))
    for whole, chunked in zip(*results, strict=True):
        assert torch.allclose(chunked, whole, atol=1e-5), (chunked - whole).abs().max()


@pytest.mark.parametrize("shared", [False, True])
def test_a_pass_gives_the_same_outputs_and_gradients_chunked(tiny_lm, monkeypatch, shared):
    tb = varied_batch(tiny_lm)
    where = response_positions(tb)
    vocabulary = tiny_lm.model.get_output_embeddings().weight.shape[0]
    results = []
    for chunk in (tb.input_ids.numel() * vocabulary, 3 * vocabulary):  # one chunk, several
        monkeypatch.setattr(output_layer, "CHUNK_ELEMENTS", chunk)
        model = copy.deepcopy(tiny_lm.model).train()
        chunked = output_layer.output_weight(model, tb.input_ids.numel()) is not None
        assert chunked == (chunk < tb.input_ids.numel() * vocabulary)
        out = (shared_prefix_outputs(model, tb, 0.7, prompt_sharing(tb), entropy_grad=True,
                                     hidden=True) if shared
               else policy_outputs(model, tb, 0.7, entropy_grad=True, hidden=True))
        (out.logprobs[where].sum() + out.entropy[where].sum()
         + out.hidden[where].square().mean()).backward()
        results.append((out, {n: p.grad for n, p in model.named_parameters()}))
    (whole, whole_grads), (chunked, chunked_grads) = results
    for field in ("logprobs", "entropy", "hidden"):
        assert torch.allclose(getattr(chunked, field)[where], getattr(whole, field)[where],
                              atol=1e-5), field
    for name, grad in whole_grads.items():
        assert torch.allclose(chunked_grads[name], grad, atol=1e-5), name


def tiny(config_class, **extra):
    torch.manual_seed(0)
    config = config_class(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                          head_dim=16, **extra)
    return transformers.AutoModelForCausalLM.from_config(config)


def test_only_a_plain_output_layer_is_chunked():
    positions = 10 * output_layer.CHUNK_ELEMENTS  # far past one chunk
    llama = tiny(transformers.LlamaConfig)
    assert output_layer.output_weight(llama, positions) is llama.lm_head.weight
    assert output_layer.output_weight(llama, 1) is None  # one chunk: nothing to save
    gemma2 = tiny(transformers.Gemma2Config, final_logit_softcapping=30.0)
    assert output_layer.output_weight(gemma2, positions) is None
    cohere = tiny(transformers.CohereConfig, logit_scale=0.5)  # seen in a pass on 4 tokens
    assert output_layer.output_weight(cohere, positions) is None
