"""The peer side of bench/peers.py: TRL's GRPOTrainer in one process, on the problems, model,
batch, learning rate and loss bench/peers.py hands it. It runs in the benches' own venv
(bench/tools_venv.py: TRL pinned there, never a project dependency), so it imports nothing from
relayrl.

    bench/.venv/bin/python bench/peers_trl.py --spec SPEC.json --out DIR

SPEC.json (written by bench/peers.py): model (a Hugging Face directory), train (a JSONL of
{"prompt": text or chat messages, "answer": reference}), reward ("exact_match" or
"math_verify"), steps, prompts_per_step, samples_per_prompt, max_new_tokens, temperature,
lr, grad_clip, clip_eps, every, seed. The policy is saved as DIR/step_N every `every` steps,
its wall time (time.time()) appended to DIR/saves.jsonl; evaluation is left to the caller, so
it costs this side no training time, as on RelayRL's side.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer


def exact_match(completions: list, answer: list[str], **_) -> list[float]:
    """relayrl's exact_match: the stripped completion equals the stripped reference."""
    return [float(_text(c).strip() == a.strip()) for c, a in zip(completions, answer, strict=True)]


def math_verify(completions: list, answer: list[str], **_) -> list[float]:
    """Hugging Face math-verify, as relayrl's math_verify calls it for a plain number."""
    from math_verify import parse, verify

    pairs = zip(completions, answer, strict=True)
    return [float(verify(parse(a), parse(_text(c)))) for c, a in pairs]


def _text(completion) -> str:
    """A completion as text: TRL hands chat completions as a list of messages."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


REWARDS = {"exact_match": exact_match, "math_verify": math_verify}


def grpo_config(spec: dict, output_dir: Path) -> GRPOConfig:
    """TRL's settings for the spec: the same batch, loss, clip, learning rate and sampling as
    RelayRL's side (bench/peers_step_trl.py replays one batch under them too)."""
    n = spec["prompts_per_step"] * spec["samples_per_prompt"]
    return GRPOConfig(
        output_dir=str(output_dir), max_steps=spec["steps"], seed=spec["seed"],
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=spec["grad_clip"],
        per_device_train_batch_size=n, gradient_accumulation_steps=1,
        num_generations=spec["samples_per_prompt"], num_iterations=1,
        max_completion_length=spec["max_new_tokens"], temperature=spec["temperature"],
        top_p=1.0, top_k=0, beta=0.0, epsilon=spec["clip_eps"], loss_type="grpo",
        scale_rewards="group", use_cpu=True, bf16=spec.get("bf16", False), report_to="none",
        save_strategy="no", logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
        shuffle_dataset=False)  # the problems in the order RelayRL's scheduler hands them out


class SaveEvery(TrainerCallback):
    """The policy and its wall time every `every` steps."""

    def __init__(self, out: Path, every: int, model, tokenizer):
        self.out, self.every, self.model, self.tokenizer = out, every, model, tokenizer

    def save(self, step: int) -> None:
        path = self.out / f"step_{step:08d}"
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        with open(self.out / "saves.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "time": time.time(), "path": str(path)}) + "\n")

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            self.save(state.global_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(spec["seed"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"], padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    config = grpo_config(spec, out / "trl")
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=config,
        reward_funcs=REWARDS[spec["reward"]],
        train_dataset=load_dataset("json", data_files=spec["train"], split="train"),
        callbacks=[SaveEvery(out, spec["every"], model, tokenizer)])
    trainer.train()


if __name__ == "__main__":
    main()
