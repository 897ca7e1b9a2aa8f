"""The peer's side of bench/peers_step.py: RelayRL's batches replayed through TRL's
GRPOTrainer, step after step: TRL's advantages from the rows' rewards, its loss
(`compute_loss`), its gradient clip and its optimizer, under bench/peers_trl.py's settings.
Runs in the benches' own venv and imports nothing from relayrl.

    bench/.venv/bin/python bench/peers_step_trl.py --input RELAYRL_STEPS.pt --out OUT.json

RELAYRL_STEPS.pt (written by bench/peers_step.py): spec (bench/peers.py's, for TRL's
settings), pad_id, start and end (RelayRL's weights by parameter name), and per step the
rows (prompt tokens, response tokens, reward; groups of samples_per_prompt in turn), the
clipped gradient and its norm. OUT.json: per step TRL's gradient norm, the relative
difference of the clipped gradients and their cosine; the relative difference of the
weights' change over all steps.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import trl
from datasets import load_dataset
from peers_trl import REWARDS, grpo_config
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOTrainer
from trl.trainer.utils import nanstd


def advantages(rewards: torch.Tensor, group: int) -> torch.Tensor:
    """TRL 1.16's, as _generate_and_score_completions computes them for scale_rewards="group"
    (it offers no function of its own): minus the group's mean, over its std plus 1e-4."""
    grouped = rewards.view(-1, group)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(group)
    std = nanstd(grouped, dim=1).repeat_interleave(group)
    return torch.nan_to_num((rewards - mean) / (std + 1e-4), nan=0.0)


def inputs(rows: list, pad_id: int, group: int) -> dict[str, torch.Tensor]:
    """TRL's layout: prompts padded on the left, completions (each ending at its EOS, or at
    the length cap) on the right."""
    width_p = max(len(p) for p, _, _ in rows)
    width_c = max(len(c) for _, c, _ in rows)
    out = {"prompt_ids": torch.full((len(rows), width_p), pad_id),
           "prompt_mask": torch.zeros(len(rows), width_p, dtype=torch.long),
           "completion_ids": torch.full((len(rows), width_c), pad_id),
           "completion_mask": torch.zeros(len(rows), width_c, dtype=torch.long)}
    for i, (p, c, _) in enumerate(rows):
        out["prompt_ids"][i, width_p - len(p):] = torch.tensor(p)
        out["prompt_mask"][i, width_p - len(p):] = 1
        out["completion_ids"][i, :len(c)] = torch.tensor(c)
        out["completion_mask"][i, :len(c)] = 1
    out["advantages"] = advantages(torch.tensor([r for _, _, r in rows]), group)
    return out


def relative(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(|theirs - ours| / |theirs|, cosine) over all parameters together."""
    diff = sum(((theirs[n] - ours[n]) ** 2).sum().item() for n in theirs) ** 0.5
    size = sum((t ** 2).sum().item() for t in theirs.values()) ** 0.5
    other = sum((o ** 2).sum().item() for o in ours.values()) ** 0.5
    dot = sum((theirs[n] * ours[n]).sum().item() for n in theirs)
    return diff / max(size, 1e-30), dot / max(size * other, 1e-30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    data = torch.load(args.input, weights_only=True)  # tensors, lists, dicts, numbers
    spec = data["spec"]
    tokenizer = AutoTokenizer.from_pretrained(spec["model"], padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer,
        args=grpo_config(spec, Path(args.out).parent / "trl"),
        reward_funcs=REWARDS[spec["reward"]],
        train_dataset=load_dataset("json", data_files=spec["train"], split="train"))
    trainer.create_optimizer_and_scheduler(num_training_steps=len(data["steps"]))
    trainer.current_gradient_accumulation_steps = 1  # set by its training loop otherwise
    model = trainer.model
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    steps = []
    for step in data["steps"]:
        model.train()
        loss = trainer.compute_loss(model, inputs(step["rows"], data["pad_id"],
                                                  spec["samples_per_prompt"]))
        trainer.accelerator.backward(loss)
        norm = trainer.accelerator.clip_grad_norm_(model.parameters(), spec["grad_clip"])
        grads = {n: p.grad.detach() for n, p in model.named_parameters()}
        diff, cosine = relative(step["grads"], grads)
        steps.append({"grad_norm": float(norm), "relative_difference": diff, "cosine": cosine})
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)
    ours = {n: data["end"][n] - data["start"][n] for n in start}
    theirs = {n: p.detach() - start[n] for n, p in model.named_parameters()}
    Path(args.out).write_text(json.dumps({
        "steps": steps, "update_relative_difference": relative(ours, theirs)[0],
        "trl_version": trl.__version__, "optimizer": type(trainer.optimizer).__name__}))


if __name__ == "__main__":
    main()
