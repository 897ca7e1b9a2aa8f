"""model.dtype bfloat16: the trainer keeps float32 master weights and ships each version in
bfloat16 (half the bytes), an engine loaded in bfloat16 takes it, and the engine/trainer
log-probability gap stays small. auto reads the checkpoint's own dtype."""

import json
import threading

import pytest
import torch

from relay_svc.version_store import VersionStore
from relayrl.config import RunConfig
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.messages import encode_batch
from relayrl.contracts.streams import FIELD
from relayrl.models.loading import load_model
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from rollout_svc.torch_engine import TorchEngine
from tests.integration.test_trainer_resume import make_batch
from trainer_svc.publisher import AsyncPublisher
from trainer_svc.trainer import Trainer


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
        "rollout": {"samples_per_prompt": 2, "max_new_tokens": 3},
        "buffer": {"group_size": 2, "groups_per_batch": 2},
        "trainer": {"max_staleness": 100, "progress": False, "engine_check_seqs": 0},
    })
    store = VersionStore(4)
    try:
        t = Trainer(cfg, load_model(tiny_lm.path), connect(server.url),
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
