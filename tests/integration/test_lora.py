"""A LoRA adapter trained in place of the whole model: the base stays frozen and holds no
optimizer state, the KL reference is the base with the adapter off (no second copy), a
version ships the adapter alone and an engine applies it to produce the trainer's very
model, and a checkpoint holds the adapter and resumes it exactly."""

import importlib.util
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from relay_svc.version_store import VersionStore
from relayrl.config import HfModel, RunConfig
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.messages import encode_batch
from relayrl.contracts.streams import FIELD
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from relayrl_ops.export import export
from relayrl_torch.models.loading import load_model
from relayrl_torch.models.lora import adapter_state, is_lora, with_lora
from rollout_svc.engines.torch import TorchEngine
from tests.integration.test_trainer_resume import make_batch
from trainer_svc import checkpoint
from trainer_svc.loop import Trainer
from trainer_svc.publisher import AsyncPublisher

LORA = {"rank": 4, "alpha": 8, "target_modules": "all-linear"}


@pytest.fixture
def env(tmp_path, tiny_lm):
    server = EmbeddedRedis(tmp_path)
    cfg = RunConfig.model_validate({
        "run_id": "lora", "run_dir": str(tmp_path / "run"), "redis": {"url": server.url},
        "task": {"digits": 1, "eval_size": 4},
        "rollout": {"max_new_tokens": 3},
        "buffer": {"group_size": 2, "groups_per_batch": 2},
        "trainer": {"lora": LORA, "max_staleness": 100, "optimizer": {"lr": 5e-2},
                    "progress": False, "engine_check_seqs": 0,
                    "loss": {"name": "grpo", "kl_coef": 0.1}},
    })
    yield cfg, connect(server.url), tiny_lm
    server.shutdown()


def trainer_of(cfg, r, path, store: VersionStore) -> Trainer:
    torch.manual_seed(0)
    return Trainer(cfg.trainer_part(), load_model(path), r, AsyncPublisher(store))


def step(t: Trainer, first_prompt: int) -> None:
    batch = make_batch(t.lm, first_prompt)
    t.r.xadd(RunKeys(t.cfg.run_id).batches, {FIELD: encode_batch(batch)})
    t.train_step(*t.next_batch(threading.Event()))


def test_the_adapter_trains_and_ships_alone_and_an_engine_applies_it(env):
    cfg, r, tiny = env
    store = VersionStore(8)
    t = trainer_of(cfg, r, tiny.path, store)
    base = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    assert is_lora(t.lm.model) and t.learner.objective.reference is None
    trained = [p for p in t.lm.model.parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n, p in t.lm.model.named_parameters()
                           if p.requires_grad)
    step(t, 10)
    step(t, 20)
    t.publisher.wait()

    # the base is untouched, and only the adapter's parameters have optimizer state
    merged_base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
                   for k, v in t.lm.model.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(merged_base[k], v) for k, v in base.items())
    assert {id(p) for p in t.optimizer.state} <= {id(p) for p in trained}
    adapter = adapter_state(t.lm.model)
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # B moved

    # a version is the adapter alone: a small share of the model's bytes
    shipped = store.pull(t.step)
    assert set(shipped) == set(adapter)
    full = sum(v.numel() * v.element_size() for v in base.values())
    ships = sum(v.numel() * v.element_size() for v in shipped.values())
    assert ships < full / 2

    # an engine on the base model with the same adapter settings becomes the trainer's model
    engine_lm = load_model(tiny.path)
    engine_lm.model = with_lora(engine_lm.model, cfg.trainer.lora)
    engine = TorchEngine(engine_lm)
    engine.load_weights(shipped, t.step)
    ids = torch.tensor([t.lm.encode_prompt("3+4=")])
    t.lm.model.eval()
    with torch.no_grad():
        assert torch.allclose(engine_lm.model(ids).logits, t.lm.model(ids).logits, atol=1e-6)
    with pytest.raises(ValueError, match=r"version \d+: missing .*lora_A"):
        engine.load_weights({"x": torch.zeros(1)}, t.step + 1)
    t.publisher.close()


def test_a_checkpoint_holds_the_adapter_and_resumes_it_exactly(env):
    cfg, r, tiny = env
    t = trainer_of(cfg, r, tiny.path, VersionStore(8))
    step(t, 10)
    t.save_checkpoint()
    saved = {k: v.clone() for k, v in adapter_state(t.lm.model).items()}
    t.publisher.close()
    path = checkpoint.latest(t.ckpt_dir)
    assert (path / "adapter_model.safetensors").is_file()
    assert not (path / "model.safetensors").exists()  # the base is not written again

    again = trainer_of(cfg, r, tiny.path, VersionStore(8))
    again.resume()
    assert again.step == 1
    restored = adapter_state(again.lm.model)
    assert all(torch.equal(restored[k], v) for k, v in saved.items())
    again.publisher.close()

    # exported: the adapter merged into the base, a plain model computing the same logits
    run = cfg.model_copy(update={"model": HfModel(path=str(tiny.path))})
    out = export(run, path, path.parent.parent / "exported")
    plain = AutoModelForCausalLM.from_pretrained(out)
    assert not is_lora(plain) and (out / "tokenizer_config.json").is_file()
    ids = torch.tensor([again.lm.encode_prompt("3+4=")])
    again.lm.model.eval()
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, again.lm.model(ids).logits, atol=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
@pytest.mark.parametrize("serving", ["adapter", "merged"])
def test_vllm_serves_each_adapter_version_as_the_trainers_model(tmp_path, serving):
    """vLLM applies adapter versions through its LoRA support (the base untouched) or merged
    into the base weights read afresh: either way its log-probabilities are the peft
    model's, version after version, and a version that is not the adapter is refused."""
    from relayrl.config import LoraConfig, TinyModel
    from relayrl_tasks.tasks import AdditionTask
    from relayrl_torch.models.tiny import SPECIALS, build_model, build_tokenizer
    from rollout_svc.engines.api import SamplingSpec
    from rollout_svc.engines.vllm import VllmEngine

    build_tokenizer(AdditionTask.alphabet, tmp_path)  # head size 32: vLLM's CPU smallest
    build_model(TinyModel(hidden_size=128, num_layers=2, num_heads=4),
                len(SPECIALS) + len(set(AdditionTask.alphabet)), tmp_path
                ).save_pretrained(tmp_path)
    lora = LoraConfig(**LORA)
    trained = with_lora(AutoModelForCausalLM.from_pretrained(tmp_path), lora).eval()
    lm = load_model(tmp_path)
    engine = VllmEngine(tmp_path, kv_cache_gib=0.0625, lora=lora, lora_serving=serving)
    try:  # merged: vLLM runs without its LoRA layers
        assert (engine.llm.llm_engine.vllm_config.lora_config is None) == (serving == "merged")
        prompts = [lm.encode_prompt(p) for p in ("3+4=", "12+9=", "7+7=")]
        for version in (1, 2):
            torch.manual_seed(version)
            with torch.no_grad():
                for name, p in trained.named_parameters():
                    if "lora_" in name:
                        p.normal_(0, 0.5)
            engine.load_weights({k: v.clone() for k, v in adapter_state(trained).items()},
                                version)
            outs = engine.generate(prompts, SamplingSpec(max_new_tokens=4, temperature=1.0))
            assert engine.version == version
            for prompt, out in zip(prompts, outs, strict=True):
                ids = torch.tensor([prompt + out.tokens])
                with torch.no_grad():
                    logp = torch.log_softmax(trained(ids).logits[0, :-1].float(), -1)
                want = logp[len(prompt) - 1:].gather(-1, ids[0, len(prompt):, None])[:, 0]
                assert torch.allclose(torch.tensor(out.logprobs), want, atol=1e-4), version
        with pytest.raises(ValueError, match="version 3"):
            engine.load_weights({"base_model.model.nope.lora_A.weight": torch.zeros(1)}, 3)
        assert engine.version == 2
    finally:
        engine.close()
