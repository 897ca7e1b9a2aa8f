"""Device resolution (relayrl_torch.devices), the device and precision config fields, the
trainer's precision policy (trainer_svc.precision) and the evaluator's devices
(eval_svc.follower) for every branch, CUDA faked where the branch needs a GPU."""

import pytest
import torch
from pydantic import ValidationError

from eval_svc.follower import devices
from relayrl.config import (
    ConfigError,
    EvalConfig,
    EvalRun,
    RunConfig,
    TorchEngineConfig,
    TrainerConfig,
    load_run_config,
)
from relayrl_torch.devices import model_device, resolve_device
from trainer_svc import precision as precision_mod
from trainer_svc.distributed import World, init_world
from trainer_svc.precision import resolve_precision


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return monkeypatch


def test_cpu_is_the_cpu_and_auto_is_the_cpu_without_cuda(no_cuda):
    assert resolve_device("cpu", "trainer.device") == torch.device("cpu")
    assert resolve_device("auto", "trainer.device") == torch.device("cpu")


@pytest.mark.parametrize("spec", ["cuda", "cuda:0"])
def test_a_gpu_asked_for_without_cuda_is_refused_naming_the_field(no_cuda, spec):
    with pytest.raises(ValueError, match=rf"rollout\.device: '{spec}' asks for a GPU.*"
                                         "CUDA is not available"):
        resolve_device(spec, "rollout.device")


def test_auto_and_cuda_take_gpu_0_or_the_local_rank(two_gpus):
    assert resolve_device("auto", "trainer.device") == torch.device("cuda", 0)
    assert resolve_device("cuda", "trainer.device") == torch.device("cuda", 0)
    two_gpus.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto", "trainer.device") == torch.device("cuda", 1)
    assert resolve_device("cuda", "trainer.device") == torch.device("cuda", 1)
    assert resolve_device("cpu", "trainer.device") == torch.device("cpu")


def test_a_named_gpu_must_exist(two_gpus):
    assert resolve_device("cuda:1", "rollout.device") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"rollout\.device: 'cuda:2' names GPU 2.* has 2 "
                                         r"GPU\(s\), at most cuda:1"):
        resolve_device("cuda:2", "rollout.device")


def test_a_local_rank_past_the_gpus_is_refused(two_gpus):
    two_gpus.setenv("LOCAL_RANK", "2")
    with pytest.raises(ValueError, match=r"trainer\.device: 'auto' takes GPU LOCAL_RANK=2.*"
                                         "at most cuda:1"):
        resolve_device("auto", "trainer.device")
    two_gpus.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match="LOCAL_RANK='x' is not a GPU index"):
        resolve_device("cuda", "trainer.device")


@pytest.mark.parametrize("spec", ["gpu", "CUDA", "cuda:", "cuda:-1", "mps", ""])
def test_anything_else_is_not_a_device(spec):
    with pytest.raises(ValueError, match=rf"trainer\.device: '{spec}' is not a device"):
        resolve_device(spec, "trainer.device")


@pytest.mark.parametrize("model", [TrainerConfig, TorchEngineConfig, EvalConfig])
def test_the_config_fields_default_to_auto_and_refuse_a_misspelling(model):
    assert model().device == "auto"
    assert model(device="cuda:3").device == "cuda:3"  # whether it exists: at start-up
    with pytest.raises(ValidationError, match="device"):
        model(device="gpu0")


def test_a_run_config_names_the_bad_field(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("trainer: {device: gpu}\n")
    with pytest.raises(ConfigError, match=r"trainer\.device"):
        load_run_config(path)
    path.write_text("trainer: {precision: fp16}\n")
    with pytest.raises(ConfigError, match=r"trainer\.precision"):
        load_run_config(path)


def evaluator(device: str, plane: str = "grpc") -> EvalRun:
    return RunConfig.model_validate({
        "eval": {"mode": "separate", "device": device},
        "rollout": {"weight_plane": plane}, "relay": {"data_planes": ["grpc", plane]},
    }).part("eval_svc")


def test_the_evaluator_holds_its_model_and_receives_nccl_versions_on_eval_device(two_gpus):
    assert devices(evaluator("auto")) == (torch.device("cuda", 0), None)
    assert devices(evaluator("cuda:1")) == (torch.device("cuda", 1), None)
    both = torch.device("cuda", 1)
    assert devices(evaluator("cuda:1", "nccl")) == (both, both)
    with pytest.raises(ValueError, match=r"eval\.device: 'cuda:2' names GPU 2"):
        devices(evaluator("cuda:2"))


def test_the_evaluator_without_cuda_decodes_on_the_cpu_or_names_eval_device(no_cuda):
    assert devices(evaluator("auto")) == (torch.device("cpu"), None)
    with pytest.raises(ValueError, match=r"eval\.device: 'cuda' asks for a GPU"):
        devices(evaluator("cuda"))
    with pytest.raises(ValueError, match=r"nccl' plane needs CUDA, and eval\.device='auto'"):
        devices(evaluator("auto", "nccl"))


def test_one_process_resolves_its_device_once(no_cuda, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_world("cpu") == World()
    with pytest.raises(ValueError, match=r"trainer\.device: 'cuda'"):
        init_world("cuda")


def test_torchrun_refuses_one_fixed_gpu_for_every_rank(monkeypatch):
    for var, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=r"trainer\.device: 'cuda:0' would put all 2"):
        init_world("cuda:0")


def test_precision_auto_is_fp32_on_the_cpu_and_bf16_asks_for_autocast():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu).autocast_dtype is None
    assert resolve_precision("fp32", cpu).name == "fp32"
    assert resolve_precision("bf16", cpu).autocast_dtype is torch.bfloat16
    with pytest.raises(ValueError, match="trainer.precision: 'fp16'"):
        resolve_precision("fp16", cpu)


def test_fsdp_gathers_in_bfloat16_and_reduces_in_float32_under_bf16_alone():
    cpu = torch.device("cpu")
    bf16 = resolve_precision("bf16", cpu).fsdp_policy()
    assert (bf16.param_dtype, bf16.reduce_dtype) == (torch.bfloat16, torch.float32)
    fp32 = resolve_precision("fp32", cpu).fsdp_policy()
    assert (fp32.param_dtype, fp32.reduce_dtype, fp32.output_dtype) == (None, None, None)


@pytest.mark.parametrize("supported", [True, False])
def test_precision_auto_on_a_gpu_is_bf16_where_it_is_supported(monkeypatch, supported):
    monkeypatch.setattr(precision_mod, "_cuda_bf16", lambda device: supported)
    gpu = torch.device("cuda", 0)
    assert resolve_precision("auto", gpu).name == ("bf16" if supported else "fp32")
    assert resolve_precision("fp32", gpu).name == "fp32"
    if supported:
        assert resolve_precision("bf16", gpu).autocast_dtype is torch.bfloat16
    else:
        with pytest.raises(ValueError, match="trainer.precision: bf16 on cuda:0"):
            resolve_precision("bf16", gpu)


def test_a_module_without_parameters_is_on_the_cpu(tiny_lm):
    assert model_device(torch.nn.Identity()) == torch.device("cpu")
    assert model_device(tiny_lm.model) == torch.device("cpu")
