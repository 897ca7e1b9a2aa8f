"""How far the sampling engine's log-probabilities sit from the trainer's, every step.

Two views of the same tokens. Tokens scored by the trainer under the very version that
sampled them measure the engine itself (kernels, dtype, sampler): the gap should be ~0, and a
growing one means the engine and trainer disagree about the policy. In an asynchronous run
most tokens come from a version or two back, so the trainer keeps the last few versions'
parameters and re-scores a handful of such sequences under their own version each step
(`trainer.engine_check_versions`, `trainer.engine_check_seqs`). All policy tokens
together measure what the importance-sampling correction has to undo (engine gap plus
staleness). The KL estimate is k3 = r - 1 - log r with r = pi/mu, unbiased for KL(mu || pi)
on tokens sampled from mu, and never negative.
"""

from __future__ import annotations

import torch

from relayrl_torch.models.routing import replayed
from relayrl_torch.weights.shm_handoff import StagedVersion


def _gap(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor):
    n = mask.sum()
    log_ratio = (trainer_logp - engine_logp) * mask
    k3 = (torch.exp(log_ratio) - 1.0 - log_ratio).clamp(min=0.0) * mask  # >= 0 but for rounding
    return (log_ratio.abs().sum() / n).item(), (k3.sum() / n).item(), int(n.item())


@torch.no_grad()
def logprob_gaps(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                 token_versions: torch.Tensor, version: int,
                 rescored: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, float]:
    """All [B, T] tensors aligned on next-token positions; `mask` 1.0 on policy tokens;
    `token_versions` the version that sampled each token; `trainer_logp` under `version`.
    `rescored` (logp, 1.0 where valid): older tokens re-scored under their own version (see
    rescore_older_tokens), which join the engine check. By StepFigures field; a figure with no
    tokens is left out."""
    out: dict[str, float] = {}
    mask = mask.float()
    if mask.sum() == 0:
        return out
    absdiff, kl, _ = _gap(trainer_logp, engine_logp, mask)
    out["offpolicy_logp_absdiff"] = absdiff
    out["offpolicy_kl"] = kl
    same = mask * (token_versions == version).float()
    reference = trainer_logp
    if rescored is not None:
        logp, valid = rescored
        valid = valid * mask * (1.0 - same)
        reference = torch.where(valid > 0, logp, trainer_logp)
        same = same + valid
    out["engine_tokens_frac"] = (same.sum() / mask.sum()).item()
    if same.sum() > 0:
        absdiff, kl, _ = _gap(reference, engine_logp, same)
        out["engine_logp_absdiff"] = absdiff
        out["engine_kl"] = kl
    return out


def replayed_share(tb) -> float | None:
    """The share of the batch's policy tokens predicted at a position that replayed the
    engine's experts (TrainBatch.routes); None when the batch replays none (a dense model,
    trainer.routing_replay off)."""
    if tb.routes.shape[2] == 0:
        return None
    mask = tb.response_mask > 0
    replayed = (tb.routes[:, :-1] >= 0).all(-1).all(-1) & mask
    return (replayed.sum() / mask.sum().clamp(min=1)).item()


class VersionHistory:
    """The trained parameters of the last few versions the trainer held, so tokens sampled by
    an older version can be re-scored under exactly that version (the frozen rest, a LoRA
    run's base, is the same in every version and is not copied). A version published
    through shared memory is read from its file, shared with the relay (no copy); otherwise
    its parameters are copied into buffers allocated once and reused, `keep` copies of the
    trained parameters at most."""

    def __init__(self, keep: int):
        self.keep = keep
        # (version, parameters, the staged file they view or None for copies)
        self._slots: list[tuple[int, dict[str, torch.Tensor], StagedVersion | None]] = []

    @torch.no_grad()
    def remember(self, version: int, model: torch.nn.Module,
                 shipped: StagedVersion | None = None) -> None:
        """`shipped`: `version` as published, held for this history (which releases it):
        kept in place of a copy when it holds every trained parameter in its dtype and
        shape (a float32 version of the whole model)."""
        params = {k: v for k, v in model.named_parameters() if v.requires_grad}
        viewed = _views(shipped, params) if shipped is not None and self.keep else None
        if shipped is not None and viewed is None:
            shipped.release()
        if self.keep == 0:
            return
        # a version trained again (its step was skipped as non-finite) keeps one slot
        same = [i for i, (v, _, _) in enumerate(self._slots) if v == version]
        old = self._slots.pop(same[0]) if same else \
            self._slots.pop(0) if len(self._slots) == self.keep else None
        if old is not None and old[2] is not None:
            old[2].release()
        if viewed is not None:
            self._slots.append((version, viewed, shipped))
            return
        slot = old[1] if old is not None and old[2] is None else \
            {k: torch.empty_like(v) for k, v in params.items()}
        for name, value in params.items():
            slot[name].copy_(value)
        self._slots.append((version, slot, None))

    def get(self, version: int) -> dict[str, torch.Tensor] | None:
        return next((p for v, p, _ in self._slots if v == version), None)

    @property
    def versions(self) -> list[int]:
        return [v for v, _, _ in self._slots]

    @property
    def copies(self) -> int:
        """Versions held as copies of their own (not viewing a shipped file)."""
        return sum(held is None for _, _, held in self._slots)

    def close(self) -> None:
        for _, _, held in self._slots:
            if held is not None:
                held.release()
        self._slots.clear()


def _views(shipped: StagedVersion, params: dict[str, torch.Tensor]
           ) -> dict[str, torch.Tensor] | None:
    tensors = shipped.tensors()
    if all(n in tensors and tensors[n].dtype == p.dtype and tensors[n].shape == p.shape
           for n, p in params.items()):
        return {n: tensors[n] for n in params}
    return None


@torch.no_grad()
def rescore_older_tokens(model: torch.nn.Module, history: VersionHistory, input_ids, attention_mask,
                         mask: torch.Tensor, token_versions: torch.Tensor, temperature: float,
                         max_seqs: int, routes: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of up to `max_seqs` sequences' older-version tokens under the very
    version that sampled each, newest versions first: (logp [B, T], 1.0 where re-scored).
    The batch's tensors and the results are on the CPU; the passes, one row each (a pass's
    logits are [tokens, vocabulary]: 150 MB for a 768-token SmolLM2 row), run on the
    model's device, in whatever autocast context the caller holds (the trainer's precision),
    replaying `routes` (TrainBatch.routes) as the update's passes do."""
    device = next(model.parameters()).device
    logp = torch.zeros_like(mask, dtype=torch.float32)
    scored = torch.zeros_like(mask, dtype=torch.float32)
    budget = max_seqs
    for version in sorted(history.versions, reverse=True):
        if budget <= 0:
            break
        tokens = (token_versions == version) & (mask > 0)
        rows = tokens.any(-1).nonzero().flatten()[:budget]
        if len(rows) == 0:
            continue
        budget -= len(rows)
        for row in rows.tolist():
            ids = input_ids[row:row + 1].to(device)
            with replayed(model, None if routes is None else routes[row:row + 1].to(device)):
                logits = torch.func.functional_call(
                    model, history.get(version),
                    kwargs={"input_ids": ids,
                            "attention_mask": attention_mask[row:row + 1].to(device)}).logits
            lp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
            lp = lp.gather(-1, ids[:, 1:, None]).squeeze(-1).cpu()[0]
            logp[row] = torch.where(tokens[row], lp, logp[row])
            scored[row] = tokens[row].float()
    return logp, scored
