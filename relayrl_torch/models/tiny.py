"""Build, warm-start and cache the tiny Llama-architecture model of the CPU example.

The model is a real Hugging Face causal LM (config.json, model.safetensors, tokenizer.json),
so the same loading code serves it and any pretrained model. A short supervised pass on the
task's own data gives it a starting accuracy that reinforcement learning then raises.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch

from relayrl.config import TaskConfig, TinyModel
from relayrl_tasks.tasks import make_task
from relayrl_torch.models.loading import load_model
from relayrl_torch.sampling.evaluation import evaluate

log = logging.getLogger(__name__)

SPECIALS = list(TinyModel.SPECIALS)


def build_tokenizer(alphabet: str, out_dir: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(alphabet)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>",
        "model_max_length": TinyModel.CONTEXT, "clean_up_tokenization_spaces": False,
    }, indent=2))


def build_model(model_cfg: TinyModel, vocab_size: int, out_dir: Path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(model_cfg.seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.hidden_size * 4,
        num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads,
        num_key_value_heads=model_cfg.num_heads,
        max_position_embeddings=TinyModel.CONTEXT,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def _sft_batch(lm, task, first_id: int, size: int):
    rows, masks = [], []
    for i in range(size):
        p = task.problem(first_id + i)
        prompt = lm.encode_prompt(p.text)
        answer = lm.tokenizer.encode(p.reference, add_special_tokens=False) + [lm.eos_id]
        rows.append(prompt + answer)
        masks.append([0] * len(prompt) + [1] * len(answer))
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [lm.pad_id] * (width - len(r)) for r in rows])
    attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    loss_mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float)
    return ids, attn, loss_mask


def warm_start(lm, task, model_cfg: TinyModel, max_new_tokens: int, show_progress=True):
    """Supervised steps on `prompt answer<eos>` (loss on the answer only) until the held-out
    sampled accuracy reaches `sft_stop_accuracy`. Returns the last eval."""
    from tqdm import tqdm

    opt = torch.optim.AdamW(lm.model.parameters(), lr=model_cfg.sft_lr)
    # SFT draws from its own id range, far above the ids the scheduler hands out
    next_id = 10_000_000
    acc: dict[str, float] = {}
    bar = tqdm(range(model_cfg.sft_steps), desc="warm start", disable=not show_progress)
    for step in bar:
        if step % model_cfg.sft_eval_every == 0:
            acc = evaluate(lm, task.eval_problems(), task.reward_name,
                           max_new_tokens=max_new_tokens, temperature=1.0, seed=model_cfg.seed)
            bar.set_postfix(acc=f"{acc['accuracy_sampled']:.2f}")
            if acc["accuracy_sampled"] >= model_cfg.sft_stop_accuracy:
                break
        lm.model.train()
        ids, attn, loss_mask = _sft_batch(lm, task, next_id, model_cfg.sft_batch_size)
        next_id += model_cfg.sft_batch_size
        logits = lm.model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="none"
        ).view_as(loss_mask[:, 1:])
        loss = (nll * loss_mask[:, 1:]).sum() / loss_mask[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    bar.close()
    lm.model.eval()
    return acc


def build(out: Path, model_cfg: TinyModel, task_cfg: TaskConfig) -> Path:
    """Build, warm-start and save into `out`, by way of a temporary directory renamed at the
    end (a crash never leaves a half-built model where the cache looks)."""
    task = make_task(task_cfg)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    log.info("building tiny model in %s", out)
    build_tokenizer(task.alphabet, tmp)
    vocab_size = model_cfg.limits().vocab_size
    build_model(model_cfg, vocab_size, tmp).save_pretrained(tmp)
    lm = load_model(tmp)
    torch.manual_seed(model_cfg.seed)
    acc = warm_start(lm, task, model_cfg, max_new_tokens=task.max_answer_tokens)
    lm.model.save_pretrained(tmp)
    (tmp / "build_info.json").write_text(json.dumps(
        {"model": model_cfg.model_dump(), "task": task_cfg.model_dump(), "warm_start_eval": acc},
        indent=2,
    ))
    log.info("tiny model warm start: %s", acc)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
