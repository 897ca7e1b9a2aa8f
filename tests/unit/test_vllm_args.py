"""What the run config asks of vLLM reaches vllm.LLM: a KV-cache budget in bytes on a CPU
machine, a share of the GPU's memory and a tensor-parallel size on GPUs (refused where CUDA
is absent), CUDA graphs when eager mode is off. vLLM itself is stood in for by a class that
records its arguments; tests/integration/test_vllm_engine.py runs the real one."""

import types

import pytest

from rollout_svc import vllm_engine


class Recorded(Exception):
    pass


@pytest.fixture
def llm_args(monkeypatch):
    seen: dict = {}

    def record(**kwargs):
        seen.update(kwargs)
        raise Recorded

    monkeypatch.setattr(vllm_engine, "_import_vllm",
                        lambda: types.SimpleNamespace(LLM=record, SamplingParams=object))
    monkeypatch.setattr(vllm_engine, "greedy_temperature_processor", lambda: object)
    return seen


def build(path, **kwargs):
    with pytest.raises(Recorded):
        vllm_engine.VllmEngine(path, **kwargs)


def test_a_cpu_machine_gets_a_kv_cache_budget(tiny_lm, llm_args):
    build(tiny_lm.path, kv_cache_gib=0.5)
    assert llm_args["kv_cache_memory_bytes"] == 1 << 29
    assert "gpu_memory_utilization" not in llm_args
    assert llm_args["tensor_parallel_size"] == 1 and llm_args["enforce_eager"] is True


def test_gpu_settings_reach_vllm_and_are_refused_without_cuda(tiny_lm, llm_args, monkeypatch):
    with pytest.raises(ValueError, match="rollout.engine.gpu_memory_utilization"):
        vllm_engine.VllmEngine(tiny_lm.path, gpu_memory_utilization=0.8)
    with pytest.raises(ValueError, match="CUDA is not available"):
        vllm_engine.VllmEngine(tiny_lm.path, tensor_parallel_size=2)
    monkeypatch.setattr(vllm_engine.torch.cuda, "is_available", lambda: True)
    build(tiny_lm.path, gpu_memory_utilization=0.8, tensor_parallel_size=2, enforce_eager=False)
    assert llm_args["gpu_memory_utilization"] == 0.8
    assert "kv_cache_memory_bytes" not in llm_args
    assert llm_args["tensor_parallel_size"] == 2 and llm_args["enforce_eager"] is False
