"""What the run config asks of vLLM reaches vllm.LLM: a KV-cache budget in bytes on a CPU
machine; on a GPU, memory vLLM's start-up check accepts beside other processes on the same
GPU (or a refusal naming the numbers), a tensor-parallel size and CUDA graphs when eager mode
is off; GPU settings refused where vLLM's platform has no GPU; the logits processor of the
model runner vLLM picks; a mixture of experts' routed experts asked for where vLLM returns
them (its V2 model runner) and turned into a completion's routes. vLLM itself is stood in
for by a class that records its arguments and a platform that says where it runs;
tests/integration/test_vllm_engine.py runs the real one."""

import types

import pytest

from rollout_svc.engines import vllm as vllm_engine
from rollout_svc.engines.vllm import GIB, GPU_HEADROOM, gpu_memory_args


class Recorded(Exception):
    pass


def platform(device_type: str):
    return types.SimpleNamespace(device_type=device_type,
                                 is_cuda_alike=lambda: device_type == "cuda")


@pytest.fixture
def llm_args(monkeypatch):
    seen: dict = {}

    def record(**kwargs):
        seen.update(kwargs)
        raise Recorded

    monkeypatch.setattr(vllm_engine, "_import_vllm",
                        lambda: types.SimpleNamespace(LLM=record, SamplingParams=object))
    monkeypatch.setattr(vllm_engine, "runs_v2_model_runner", lambda args: False)
    monkeypatch.setattr(vllm_engine, "_platform", lambda: platform("cpu"))
    return seen


@pytest.fixture
def on_gpu(monkeypatch, llm_args):
    """vLLM on a CUDA GPU of 80 GiB with 60 GiB free, running its V2 model runner."""
    monkeypatch.setattr(vllm_engine, "_platform", lambda: platform("cuda"))
    monkeypatch.setattr(vllm_engine, "runs_v2_model_runner", lambda args: True)
    monkeypatch.setattr(vllm_engine.torch.cuda, "mem_get_info",
                        lambda i=0: (60 * GIB, 80 * GIB))
    return llm_args


def build(path, **kwargs):
    with pytest.raises(Recorded):
        vllm_engine.VllmEngine(path, **kwargs)


def test_a_cpu_machine_gets_a_kv_cache_budget_and_the_v1_processor(tiny_lm, llm_args):
    build(tiny_lm.path, kv_cache_gib=0.5)
    assert llm_args["kv_cache_memory_bytes"] == 1 << 29
    assert "gpu_memory_utilization" not in llm_args
    assert llm_args["tensor_parallel_size"] == 1 and llm_args["enforce_eager"] is True
    (processor,) = llm_args["logits_processors"]
    assert processor.__name__ == "GreedyTemperatureV1"


def test_gpu_settings_are_refused_where_vllm_runs_on_the_cpu(tiny_lm, llm_args):
    with pytest.raises(ValueError, match="rollout.engine.gpu_memory_utilization.*runs on cpu"):
        vllm_engine.VllmEngine(tiny_lm.path, gpu_memory_utilization=0.8)
    with pytest.raises(ValueError, match="runs on cpu"):
        vllm_engine.VllmEngine(tiny_lm.path, tensor_parallel_size=2)


def test_on_a_gpu_the_kv_cache_is_reserved_and_vllm_checks_only_what_it_holds(tiny_lm,
                                                                            on_gpu):
    build(tiny_lm.path, kv_cache_gib=4)
    assert on_gpu["kv_cache_memory_bytes"] == 4 * GIB
    share = on_gpu["gpu_memory_utilization"]
    assert 4 / 80 < share < 4.01 / 80  # the KV cache and the tiny model's weights
    (processor,) = on_gpu["logits_processors"]
    assert processor.__name__ == "GreedyTemperatureV2"


def test_an_explicit_share_reaches_vllm_with_tensor_parallelism(tiny_lm, on_gpu):
    build(tiny_lm.path, gpu_memory_utilization=0.7, tensor_parallel_size=2,
          enforce_eager=False)
    assert on_gpu["gpu_memory_utilization"] == 0.7
    assert "kv_cache_memory_bytes" not in on_gpu
    assert on_gpu["tensor_parallel_size"] == 2 and on_gpu["enforce_eager"] is False


def test_vllm_start_up_check_passes_beside_a_trainer_holding_most_of_the_gpu():
    # vLLM refuses unless free >= ceil(total x utilization): what it is given passes that
    total, free = 80 * GIB, 12 * GIB  # a trainer holds 68 GiB
    args = gpu_memory_args(free, total, weights=2 * GIB, kv_bytes=8 * GIB, utilization=0)
    assert args["kv_cache_memory_bytes"] == 8 * GIB
    assert -(-total * args["gpu_memory_utilization"] // 1) <= free
    # vLLM's own default, 0.92, would have been refused there
    with pytest.raises(ValueError, match=r"gpu_memory_utilization: 0.92 of this GPU is 73.60 "
                       r"GiB, and 12.00 GiB of the GPU's 80.00 GiB are free \(68.00 GiB held "
                       r"elsewhere\).*at most 0.15"):
        gpu_memory_args(free, total, 2 * GIB, 8 * GIB, utilization=0.92)


def test_a_worker_that_cannot_fit_is_refused_before_vllm_starts_naming_the_numbers():
    total, free = 80 * GIB, 10 * GIB
    with pytest.raises(ValueError, match=r"kv_cache_gib: this worker needs 11.00 GiB of its "
                       r"GPU \(weights 2.00 GiB, KV cache 8.00 GiB, 1.00 GiB for activations "
                       r"and buffers\), and 10.00 GiB of the GPU's 80.00 GiB are free"):
        gpu_memory_args(free, total, 2 * GIB, 8 * GIB, utilization=0)
    assert GPU_HEADROOM == GIB


def test_the_kv_side_channel_listens_where_other_engines_dial_the_worker(tiny_lm, llm_args,
                                                                        monkeypatch):
    from rollout_svc.engines import vllm_kv
    from rollout_svc.engines.vllm_kv import SIDE_CHANNEL_ENV, SIDE_CHANNEL_HOST_ENV

    monkeypatch.delenv(SIDE_CHANNEL_ENV, raising=False)
    monkeypatch.delenv(SIDE_CHANNEL_HOST_ENV, raising=False)
    # NIXL's native library is not loaded into the suite's processes: its load once
    # aborted a whole process among many threads (relay_svc.planes loads it first thing)
    monkeypatch.setattr(vllm_kv, "_alias_nixl", lambda: None)
    build(tiny_lm.path, kv_transfer_port=5600, kv_transfer_host="10.0.0.2")
    assert llm_args["kv_transfer_config"].kv_connector == "NixlConnector"
    assert (vllm_engine.os.environ[SIDE_CHANNEL_HOST_ENV],
            vllm_engine.os.environ[SIDE_CHANNEL_ENV]) == ("10.0.0.2", "5600")


@pytest.fixture
def moe_dir(tmp_path, tiny_lm):
    """A random Qwen3-MoE (4 experts, top-2, 2 layers) over the tiny tokenizer."""
    from transformers import AutoModelForCausalLM

    from relayrl_testkit.families import family_config

    model = AutoModelForCausalLM.from_config(family_config("qwen3_moe", tiny_lm.tokenizer))
    model.save_pretrained(tmp_path / "moe")
    tiny_lm.tokenizer.save_pretrained(tmp_path / "moe")
    return tmp_path / "moe"


def test_routed_experts_are_asked_of_vllms_v2_runner_for_a_mixture_of_experts(moe_dir,
                                                                            on_gpu):
    build(moe_dir, routed_experts=True)
    assert on_gpu["enable_return_routed_experts"] is True


@pytest.mark.parametrize("case", ["dense", "replay off", "V1 runner"])
def test_routed_experts_are_not_asked_where_there_are_none_or_vllm_returns_none(
        case, tiny_lm, moe_dir, on_gpu, monkeypatch):
    if case == "V1 runner":  # vLLM's AuxOutputConfig refuses to start on it
        monkeypatch.setattr(vllm_engine, "runs_v2_model_runner", lambda args: False)
    build(tiny_lm.path if case == "dense" else moe_dir, routed_experts=case != "replay off")
    assert "enable_return_routed_experts" not in on_gpu


def test_vllms_routed_experts_become_the_completions_routes():
    """vLLM's [positions fed, decoder layers, top_k] kept at the expert layers, transposed."""
    pytest.importorskip("vllm")
    import numpy as np
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput

    from rollout_svc.engines.vllm_sampling import completion

    rows = np.arange(5 * 3 * 2, dtype=np.uint8).reshape(5, 3, 2)  # 4 prompt + 2 tokens - 1
    out = CompletionOutput(index=0, text="", token_ids=[7, 8], cumulative_logprob=None,
                           logprobs=[{7: Logprob(-1.0)}, {8: Logprob(-2.0)}],
                           routed_experts=rows, finish_reason="length")
    routes = completion(out, expert_layers=[0, 2]).routes
    assert routes.shape == (2, 5, 2) and routes.dtype == np.uint8
    assert np.array_equal(routes[1], rows[:, 2]) and np.array_equal(routes[0], rows[:, 0])
    assert completion(out).routes is None
