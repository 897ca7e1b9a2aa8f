"""`relayrl eval CONFIG --checkpoint DIR`: a checkpoint's held-out scores, offline.

    relayrl eval examples/tiny_cpu.yaml --checkpoint runs/tiny/checkpoints/step_00000100
    relayrl eval run.yaml --checkpoint DIR --set heldout --json

No service runs: the checkpoint (a Hugging Face model directory, as the trainer writes under
run_dir/checkpoints/step_N) is loaded here and decoded on this machine, on eval.device, on
the config's eval sets (all, or those named with --set NAME). A checkpoint directory without
a tokenizer takes the run model's (model.kind hf, pretrained or tiny); an adapter run's
checkpoint (trainer.lora) is merged into the run model first. Prints a table and
one JSON line; --json prints the JSON line alone.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from relayrl.config import EvalRun, RunCommon
from relayrl_torch.devices import resolve_device
from relayrl_torch.evaluation.runner import SetResult, evaluate_sets
from relayrl_torch.evaluation.sets import build_sets
from relayrl_torch.models.loading import LoadedModel
from relayrl_torch.models.lora import is_adapter_dir, merged_from


def load_checkpoint(cfg: RunCommon, checkpoint: Path) -> LoadedModel:
    """The checkpoint's weights with its own tokenizer, or the run model's (`cfg`: any
    part of the run, or the whole config: it reads the model and the task)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from relayrl_torch.models import resolve_model_path

    adapter = is_adapter_dir(checkpoint)
    if not adapter and not (checkpoint / "config.json").is_file():
        raise ValueError(f"--checkpoint: {checkpoint} holds no config.json (not a Hugging "
                         "Face model directory such as run_dir/checkpoints/step_N) and no "
                         "LoRA adapter (adapter_config.json)")
    has_tokenizer = (checkpoint / "tokenizer_config.json").is_file()
    base_dir = resolve_model_path(cfg.model, cfg.task)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint if has_tokenizer else base_dir)
    if adapter:  # an adapter run's checkpoint: the run's base model with it merged
        model = merged_from(AutoModelForCausalLM.from_pretrained(base_dir), checkpoint)
    else:
        model = AutoModelForCausalLM.from_pretrained(checkpoint)
    model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, path=checkpoint)


def table(results: list[SetResult]) -> str:
    """One row per set: problems, pass@1, pass@k (k = samples), greedy accuracy, length."""
    head = ("set", "problems", "pass@1", "pass@k", "greedy", "mean length")
    rows = [head]
    for r in results:
        rows.append((
            r.name, str(r.problems), f"{r.pass_at_1:.3f}",
            "-" if r.pass_at_k is None else f"{r.pass_at_k:.3f} (k={r.samples})",
            "-" if r.accuracy_greedy is None else f"{r.accuracy_greedy:.3f}",
            f"{r.response_len_mean:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summary(checkpoint: Path, record: dict[str, float], results: list[SetResult]) -> dict:
    return {"checkpoint": str(checkpoint), "step": _step_of(checkpoint),
            "sets": [asdict(r) for r in results], "metrics": record}


def _step_of(checkpoint: Path) -> int | None:
    tail = checkpoint.name.rsplit("_", 1)[-1]
    return int(tail) if checkpoint.name.startswith("step_") and tail.isdigit() else None


def run(cfg: EvalRun, checkpoint: str | Path, names: list[str] | None = None,
        as_json: bool = False) -> int:
    """Evaluate and print; ValueError for a bad checkpoint, set name or set."""
    import torch

    checkpoint = Path(checkpoint)
    torch.set_num_threads(cfg.follows.torch_threads)
    device = resolve_device(cfg.eval.device, "eval.device")
    sets = build_sets(cfg, names=names or None)
    lm = load_checkpoint(cfg, checkpoint)
    lm.model.to(device)
    record, results = evaluate_sets(lm, sets, seed=cfg.eval.seed,
                                    batch_size=cfg.eval.batch_size)
    if not as_json:
        print(f"checkpoint {checkpoint}")
        print(table(results))
    print(json.dumps(summary(checkpoint, record, results), sort_keys=True))
    return 0


def main(cfg: EvalRun, checkpoint: str, names: list[str], as_json: bool) -> int:
    """`run`, exit 2 naming a bad checkpoint, set name or set."""
    try:
        return run(cfg, checkpoint, names, as_json)
    except ValueError as err:
        print(f"relayrl eval: {err}", file=sys.stderr)
        return 2
