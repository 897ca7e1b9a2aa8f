"""What runs on a GPU, against the same thing on the CPU: one policy update of the tiny model
(float32, the bf16 policy with its KL reference on the GPU too, a LoRA adapter), the
publisher's pinned snapshot off its own CUDA stream, the torch engine sampling on CUDA with
weights pulled as CPU tensors (an adapter version included), and the evaluator decoding on
its eval.device. Marked `gpu`; skipped where CUDA is absent (`pytest -m gpu` selects them on
a GPU machine; bench/gpu_check.sh runs them)."""

import copy

import pytest
import torch

from eval_svc.follower import devices, evaluated_model
from relay_svc.version_store import VersionStore
from relayrl.config import RunConfig, TrainerConfig
from relayrl_torch.evaluation import build_sets, evaluate_sets
from relayrl_torch.models.lora import adapter_state, with_lora
from rollout_svc.engines.api import SamplingSpec
from rollout_svc.engines.torch import TorchEngine
from tests.unit.test_precision import assert_float32_state
from tests.unit.test_shared_prefix import MAX_NEW_TOKENS, varied_batch
from trainer_svc.distributed import Parallel, World
from trainer_svc.learner import to_cpu
from trainer_svc.objective import Objective
from trainer_svc.publisher import AsyncPublisher
from trainer_svc.snapshot import Snapshot, ready_event

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is "
    "False on this machine")]

CUDA = torch.device("cuda", 0)


def one_update(lm, device: torch.device, precision: str, lora: dict | None = None):
    """(result, weights after on the CPU, model, optimizer) of one update on `device`."""
    torch.manual_seed(0)
    model = copy.deepcopy(lm.model)
    tc = TrainerConfig(precision=precision, optimizer={"lr": 1e-3}, loss={"kl_coef": 0.05},
                       lora=lora)
    if lora is not None:
        model = with_lora(model, tc.lora)
    parallel = Parallel(World(device=device))
    objective = Objective(tc, model, MAX_NEW_TOKENS, temperature=1.0, parallel=parallel)
    parallel.shard(model)  # as the Learner does: in one process, onto the world's device
    assert {p.device for p in objective.reference.parameters()} == {device}
    optimizer = recording_grad_dtypes(torch.optim.AdamW(model.parameters(), lr=tc.optimizer.lr))
    model.train()
    result = objective.update(model, optimizer, varied_batch(lm))
    return result, to_cpu(model.state_dict()), model, optimizer


def recording_grad_dtypes(optimizer):
    """`optimizer`, noting its gradients' dtypes just before each step (the update frees
    them after it), for assert_float32_state."""
    optimizer.grad_dtypes = set()
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: opt.grad_dtypes.update(
        p.grad.dtype for g in opt.param_groups for p in g["params"] if p.grad is not None))
    return optimizer


@pytest.fixture(autouse=True)
def exact_float32():
    # TF32 matmuls would make the CUDA float32 run a lower-precision one
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def test_a_float32_update_on_cuda_is_the_cpu_update(tiny_lm):
    cpu, cpu_after, _, _ = one_update(tiny_lm, torch.device("cpu"), "fp32")
    gpu, gpu_after, model, _ = one_update(tiny_lm, CUDA, "fp32")
    assert next(model.parameters()).device == CUDA
    assert gpu.old_logprobs.device.type == "cpu"
    torch.testing.assert_close(gpu.old_logprobs, cpu.old_logprobs, atol=1e-5, rtol=1e-5)
    for key in ("loss", "grad_norm", "kl_ref"):
        assert gpu.stats[key] == pytest.approx(cpu.stats[key], rel=1e-4, abs=1e-6), key
    for name in cpu_after:
        torch.testing.assert_close(gpu_after[name], cpu_after[name], atol=1e-5, rtol=1e-4)


def test_the_bf16_policy_on_cuda_keeps_float32_state_and_stays_close(tiny_lm):
    cpu, cpu_after, _, _ = one_update(tiny_lm, torch.device("cpu"), "fp32")
    gpu, gpu_after, model, optimizer = one_update(tiny_lm, CUDA, "auto")
    assert torch.cuda.is_bf16_supported()  # every GPU this runs on (Ampere and later)
    assert_float32_state(model, optimizer)
    assert gpu.old_logprobs.dtype == torch.float32
    mask = varied_batch(tiny_lm).response_mask > 0
    gap = (gpu.old_logprobs - cpu.old_logprobs)[mask].abs().max().item()
    assert 0 < gap < 0.05  # autocast ran, and bf16 rounding stays small
    assert gpu.stats["loss"] == pytest.approx(cpu.stats["loss"], abs=0.02)
    assert all(torch.isfinite(v).all() for v in gpu_after.values())


def test_fsdp2_on_one_nccl_rank_gathers_bf16_and_updates_like_one_process(tiny_lm):
    """FSDP2 on CUDA over a one-rank NCCL group, with the bf16 policy's MixedPrecisionPolicy
    on each decoder layer and the root as Parallel.shard puts them: the forward sees bf16
    parameters, the update keeps float32 state and lands where the unsharded bf16 one does."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from trainer_svc.distributed import decoder_layers
    from trainer_svc.precision import resolve_precision

    plain, plain_after, _, _ = one_update(tiny_lm, CUDA, "bf16")
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = copy.deepcopy(tiny_lm.model).to(CUDA)
        tc = TrainerConfig(precision="bf16", optimizer={"lr": 1e-3}, loss={"kl_coef": 0.05})
        # before sharding, as the Learner builds it: the KL reference is a copy of the model
        objective = Objective(tc, model, MAX_NEW_TOKENS, temperature=1.0,
                              parallel=Parallel(World(device=CUDA)))
        policy = resolve_precision("bf16", CUDA).fsdp_policy()
        mesh = init_device_mesh("cuda", (1,))
        layers = decoder_layers(model)  # fully_shard renames their classes
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        seen = []
        hook = layers[0].register_forward_pre_hook(
            lambda m, _: seen.append(next(m.parameters()).dtype))
        optimizer = recording_grad_dtypes(torch.optim.AdamW(model.parameters(),
                                                            lr=tc.optimizer.lr))
        model.train()
        sharded = objective.update(model, optimizer, varied_batch(tiny_lm))
        hook.remove()
        assert seen and set(seen) == {torch.bfloat16}  # gathered in bfloat16
        assert_float32_state(model, optimizer)
        assert sharded.stats["loss"] == pytest.approx(plain.stats["loss"], rel=5e-3, abs=1e-5)
        after = {k: v.full_tensor().cpu() if hasattr(v, "full_tensor") else v.cpu()
                 for k, v in model.state_dict().items()}
        # AdamW moves a weight by about lr whatever its gradient's size, so rounding in two
        # ways of computing a near-zero gradient moves a few weights differently
        moved = [(after[n] - t).abs() > 0.5 * tc.optimizer.lr for n, t in plain_after.items()]
        assert sum(m.sum().item() for m in moved) <= 0.02 * sum(m.numel() for m in moved)
    finally:
        dist.destroy_process_group()


LORA = {"rank": 4, "alpha": 8, "target_modules": "all-linear"}


def test_a_lora_update_on_cuda_is_the_cpu_update_and_an_engine_applies_it(tiny_lm):
    cpu, _, cpu_model, _ = one_update(tiny_lm, torch.device("cpu"), "fp32", LORA)
    gpu, _, model, _ = one_update(tiny_lm, CUDA, "fp32", LORA)
    assert gpu.stats["loss"] == pytest.approx(cpu.stats["loss"], rel=1e-4, abs=1e-6)
    adapter, on_cpu = adapter_state(model), adapter_state(cpu_model)
    assert adapter and all("lora_" in k for k in adapter) and set(adapter) == set(on_cpu)
    for name, t in adapter.items():
        torch.testing.assert_close(t.cpu(), on_cpu[name], atol=1e-5, rtol=1e-4)
    lm = copy.deepcopy(tiny_lm)
    lm.model = with_lora(lm.model, TrainerConfig(lora=LORA).lora)
    engine = TorchEngine(lm, device=CUDA)
    engine.load_weights(to_cpu(adapter), version=1)  # an adapter version, as CPU tensors
    prompt = tiny_lm.encode_prompt("12+34=")
    (out,) = engine.generate([prompt], SamplingSpec(max_new_tokens=3, greedy=True))
    ids = torch.tensor([prompt + out.tokens], device=CUDA)
    with torch.no_grad():
        logp = torch.log_softmax(model.eval()(ids).logits[0, len(prompt) - 1:-1].float(), -1)
    want = logp.gather(-1, ids[0, len(prompt):, None])[:, 0].cpu()
    assert torch.allclose(torch.tensor(out.logprobs), want, atol=1e-4)


def test_a_cuda_snapshot_lands_in_pinned_host_buffers():
    state = {"w": torch.randn(1000, device=CUDA), "b": torch.arange(7, device=CUDA)}
    expected = to_cpu(state)
    snap = Snapshot()
    snap.fill(3, 3, state, ready_event(state))
    assert snap.version == 3
    for name, buf in snap.buffers.items():
        assert buf.device.type == "cpu" and buf.is_pinned()
        assert torch.equal(buf, expected[name])


def test_the_publisher_sends_cpu_copies_of_cuda_weights():
    store = VersionStore(4)
    pub = AsyncPublisher(store)
    w = {"w": torch.zeros(4096, device=CUDA)}
    w["w"].add_(2.0)  # queued on the training stream just before the publish
    pub.publish(1, 1, w)
    pub.fence()
    w["w"].add_(5.0)  # the optimizer step after the fence
    pub.wait()
    assert torch.equal(store.pull(1)["w"], torch.full((4096,), 2.0))
    pub.close()


def test_the_engine_samples_on_cuda_as_on_the_cpu(tiny_lm):
    prompts = [tiny_lm.encode_prompt("12+34="), tiny_lm.encode_prompt("5+6=")]
    spec = SamplingSpec(max_new_tokens=4, greedy=True)
    engines = {d: TorchEngine(copy.deepcopy(tiny_lm), device=torch.device(d))
               for d in ("cpu", "cuda")}
    out = {d: e.generate(prompts, spec) for d, e in engines.items()}
    for a, b in zip(out["cpu"], out["cuda"], strict=True):
        assert a.tokens == b.tokens
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    sampled = engines["cuda"].generate(prompts, SamplingSpec(max_new_tokens=4, seed=1))
    assert all(len(c.tokens) >= 1 for c in sampled)
    moved = {k: v + 0.01 for k, v in tiny_lm.model.state_dict().items()}  # CPU tensors
    engines["cuda"].load_weights(moved, version=1)
    assert engines["cuda"].version == 1
    assert next(engines["cuda"].lm.model.parameters()).device.type == "cuda"


def test_the_evaluator_holds_its_model_on_eval_device_and_decodes_as_on_the_cpu(tiny_lm):
    records = {}
    for device in ("cpu", "cuda"):
        cfg = RunConfig.model_validate({
            "model": {"kind": "hf", "path": str(tiny_lm.path), "dtype": "float32"},
            "task": {"digits": 1, "eval_size": 8},
            "eval": {"mode": "separate", "device": device}}).part("eval_svc")
        held, _ = devices(cfg)
        lm = evaluated_model(cfg, held)
        assert {p.device.type for p in lm.model.parameters()} == {device}
        records[device], _ = evaluate_sets(lm, build_sets(cfg), seed=0, batch_size=8)
    assert sorted(records["cuda"]) == sorted(records["cpu"])
    assert records["cuda"]["eval/accuracy_greedy"] == records["cpu"]["eval/accuracy_greedy"]
