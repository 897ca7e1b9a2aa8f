"""Nothing non-finite leaves the trainer.

A step whose loss or gradient norm is not finite is skipped (trainer_svc.objective), and
`StepGuard` stops the run after `trainer.max_nonfinite_steps` of them in a row, before any
checkpoint is written over the last good one. As a last line of defence, the checkpoint
writer and the publisher refuse weights that hold a value that is not finite
(`check_finite`)."""

from __future__ import annotations

import torch


class NonFiniteError(RuntimeError):
    """Weights or steps that are not finite: the trainer stops rather than spread them."""


def is_finite(t: torch.Tensor) -> bool:
    """Whether every element of `t` is finite. A NaN or an inf makes the sum NaN or inf, so
    a finite sum settles it in one reduction (a tenth of isfinite's time, which allocates a
    mask as large as the tensor); a sum that overflowed on finite values gets the exact
    check."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def nonfinite_tensors(state: dict[str, torch.Tensor], most: int = 5) -> list[str]:
    """Names of up to `most` floating-point tensors in `state` holding a NaN or an inf."""
    bad = []
    for name, t in state.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not is_finite(t):
            bad.append(name)
            if len(bad) == most:
                break
    return bad


def check_finite(state: dict[str, torch.Tensor], what: str) -> None:
    """NonFiniteError naming the tensors of `state` that are not finite, if any."""
    bad = nonfinite_tensors(state)
    if bad:
        raise NonFiniteError(f"refusing to {what}: tensors {', '.join(bad)} hold values that "
                             "are not finite")


class StepGuard:
    """Counts steps skipped for a loss or gradient norm that is not finite, and ends the run
    after `limit` in a row (trainer.max_nonfinite_steps)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.in_a_row = 0

    def passed(self) -> None:
        self.in_a_row = 0

    def skipped(self, step: int, loss: float, grad_norm: float, last_checkpoint: str) -> None:
        """One more skipped step; NonFiniteError once `limit` are in a row."""
        self.in_a_row += 1
        if self.in_a_row >= self.limit:
            raise NonFiniteError(
                f"{self.in_a_row} steps in a row at step {step} had a loss or gradient norm "
                f"that is not finite (the last: loss {loss}, grad_norm {grad_norm}), "
                f"trainer.max_nonfinite_steps is {self.limit}: stopping the run. The last "
                f"good checkpoint ({last_checkpoint}) is left as it was; the skipped batches "
                "are in the run's quarantine (relayrl audit).")
