"""model.dtype bfloat16: the trainer keeps float32 master weights and ships each version in
bfloat16 (half the bytes), an engine loaded in bfloat16 (torch or vLLM) takes it, and the
engine/trainer log-probability gap stays small. auto reads the checkpoint's own dtype."""

import importlib.util
import json
import threading

import pytest
import torch

from relay_svc.version_store import VersionStore
from relayrl.config import RunConfig
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.messages import encode_batch
from relayrl.contracts.streams import FIELD
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from relayrl_torch.models.loading import load_model
from rollout_svc.engines.torch import TorchEngine
from tests.integration.test_trainer_resume import make_batch
from trainer_svc.loop import Trainer
from trainer_svc.publisher import AsyncPublisher


def shipped_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(ids).logits.float(), -1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_versions_ship_in_the_model_dtype(tmp_path, tiny_lm, dtype):
    server = EmbeddedRedis(tmp_path)
    cfg = RunConfig.model_validate({
        "run_id": "dtype", "run_dir": str(tmp_path / "run"), "redis": {"url": server.url},
        "model": {"kind": "hf", "path": str(tiny_lm.path), "dtype": dtype},
        "task": {"digits": 1, "eval_size": 4},
        "rollout": {"max_new_tokens": 3},
        "buffer": {"group_size": 2, "groups_per_batch": 2},
        "trainer": {"max_staleness": 100, "progress": False, "engine_check_seqs": 0},
    })
    store = VersionStore(4)
    try:
        t = Trainer(cfg.trainer_part(), load_model(tiny_lm.path), connect(server.url),
                    AsyncPublisher(store, dtype=getattr(torch, cfg.model.dtype_name())))
        t.r.xadd(RunKeys("dtype").batches, {FIELD: encode_batch(make_batch(t.lm, 10))})
        t.train_step(*t.next_batch(threading.Event()))
        t.publisher.wait()
        shipped = store.pull(1)
        assert all(p.dtype == torch.float32 for p in t.lm.model.parameters())  # the master
        assert {v.dtype for v in shipped.values()} == {getattr(torch, dtype)}
        full = shipped_bytes({k: v for k, v in t.learner.weights().items()})
        assert shipped_bytes(shipped) == (full // 2 if dtype == "bfloat16" else full)

        engine_lm = load_model(tiny_lm.path, cfg.model.dtype_name())
        TorchEngine(engine_lm).load_weights(shipped, 1)
        ids = torch.tensor([t.lm.encode_prompt("3+4=")])
        gap = (logprobs(engine_lm.model, ids) - logprobs(t.lm.model, ids)).abs().max().item()
        assert gap < (1e-5 if dtype == "float32" else 0.1), gap
        t.publisher.close()
    finally:
        server.shutdown()


def test_auto_reads_the_checkpoints_dtype(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    model = RunConfig.model_validate({"model": {"kind": "hf", "path": str(tmp_path)},
                                      "task": {"source": "addition"}}).model
    assert model.dtype_name() == "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "int8"}))
    assert model.dtype_name() == "float32"
    tiny = RunConfig.model_validate({}).model
    assert tiny.dtype_name() == "float32"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_a_bfloat16_vllm_engine_takes_bfloat16_versions(tmp_path):
    """vLLM computing in bfloat16 loads the versions shipped in it (their log-probabilities
    are the shipped model's, within bfloat16's rounding) and refuses a float32 one."""
    from relayrl.config import TinyModel
    from relayrl_tasks.tasks import AdditionTask
    from relayrl_torch.models.tiny import SPECIALS, build_model, build_tokenizer
    from rollout_svc.engines.api import SamplingSpec
    from rollout_svc.engines.vllm import VllmEngine

    build_tokenizer(AdditionTask.alphabet, tmp_path)  # head size 32: vLLM's CPU smallest
    model = build_model(TinyModel(hidden_size=128, num_layers=2, num_heads=4),
                        len(SPECIALS) + len(set(AdditionTask.alphabet)), tmp_path)
    model.save_pretrained(tmp_path)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    version = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    shipped = model.to(torch.bfloat16).eval()
    lm = load_model(tmp_path)
    engine = VllmEngine(tmp_path, kv_cache_gib=0.0625, dtype="bfloat16")
    try:
        engine.load_weights(version, 1)
        prompts = [lm.encode_prompt(p) for p in ("3+4=", "12+9=")]
        for prompt, out in zip(prompts, engine.generate(
                prompts, SamplingSpec(max_new_tokens=4, temperature=1.0)), strict=True):
            ids = torch.tensor([prompt + out.tokens])
            want = logprobs(shipped, ids)[0, len(prompt) - 1:-1].gather(
                -1, ids[0, len(prompt):, None])[:, 0]
            assert torch.allclose(torch.tensor(out.logprobs), want, atol=0.1)
        with pytest.raises(ValueError, match="float32"):
            engine.load_weights({k: v.float() for k, v in version.items()}, 2)
        assert engine.version == 1
    finally:
        engine.close()
