"""Weights & Biases output of a run's metrics (`trainer.wandb`), imported only when asked for.

    trainer: {wandb: {mode: offline, project: relayrl}}    # -> <run_dir>/wandb/offline-run-*
    wandb sync runs/tiny/wandb/offline-run-*                # later, where the network is

The trainer's run and the separate evaluator's (eval.mode separate) are two W&B runs of one
group named by run_id, because W&B takes one writer per run. Every number is logged against
`trainer/step` (the evaluator's: the evaluated version), so a resumed run that repeats steps
is plotted where it belongs rather than dropped for going back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relayrl.config import WritesMetrics


def open_wandb(cfg: WritesMetrics, job_type: str = "train") -> Any:
    """A started wandb run for trainer.wandb (cfg.metric_sinks(): a RunConfig's or an
    EvalRun's), or None when its mode is disabled; ValueError when the wandb package is
    missing or the run cannot start."""
    wc = cfg.metric_sinks().wandb
    if wc.mode == "disabled":
        return None
    try:
        import wandb
    except ImportError as err:
        raise ValueError(f"trainer.wandb.mode is {wc.mode!r}, but W&B output needs the wandb "
                         f"package (pip install wandb, or the relayrl[wandb] extra): {err}"
                         ) from None
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    name = wc.name or cfg.run_id
    try:
        run = wandb.init(
            project=wc.project, entity=wc.entity, mode=wc.mode, dir=str(run_dir),
            name=name if job_type == "train" else f"{name}-{job_type}", group=cfg.run_id,
            job_type=job_type, config=cfg.model_dump(mode="json"), reinit="create_new",
            settings=wandb.Settings(silent=True, console="off"))
    except Exception as err:  # a login, the network, the service: all reported alike
        raise ValueError(f"trainer.wandb: the W&B run could not start ({wc.mode}): "
                         f"{type(err).__name__}: {err}") from None
    run.define_metric("trainer/step")
    run.define_metric("*", step_metric="trainer/step")
    return run
