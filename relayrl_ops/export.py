"""`relayrl export CONFIG --checkpoint DIR --out OUT`: a checkpoint as a standalone Hugging
Face model directory (weights, config, tokenizer), for any tool that loads one.

    relayrl export run.yaml --checkpoint runs/x/checkpoints/step_00000060 --out models/x

An adapter run's checkpoint (trainer.lora) is merged into the run's base model; a full
fine-tuning checkpoint is copied with the run model's tokenizer beside it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from relayrl.config import RunConfig


def export(cfg: RunConfig, checkpoint: Path, out: Path) -> Path:
    """Write `checkpoint` as a Hugging Face model directory at `out` (which must be empty or
    absent); returns `out`."""
    from eval_svc.offline import load_checkpoint

    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out: {out} is not empty")
    lm = load_checkpoint(cfg, checkpoint)
    lm.model.save_pretrained(out)
    lm.tokenizer.save_pretrained(out)
    return out


def main(cfg: RunConfig, checkpoint: str, out: str) -> int:
    """`relayrl export`: export, print where, and return the exit status (2 on an error)."""
    try:
        written = export(cfg, Path(checkpoint), Path(out))
    except (ValueError, OSError) as err:
        print(f"relayrl export: {err}", file=sys.stderr)
        return 2
    print(f"exported {checkpoint} to {written}")
    return 0
