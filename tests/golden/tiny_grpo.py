"""The golden-loss run: a deterministic, synchronous tiny GRPO run whose per-step figures are
checked in (tiny_grpo.json), so that a refactor that changes the numerics shows up.

One process drives the project's own pieces as the services do, minus the transport: the
tiny model builder (relayrl_torch.models.tiny, a short warm start so rewards vary), the torch
engine the rollout worker samples with (rollout_svc.engines.torch, weights loaded into it
each step as from the relay), the task's reward through the worker's scoring
(relayrl.plugins.rewards.score), the wire codec (relayrl.contracts.messages), and the trainer's
staleness split, collation and Learner (trainer_svc). Staleness is 0: every batch is sampled by the
weights it trains. One CPU thread and fixed seeds make it bit-reproducible on a machine.

    python -m tests.golden.tiny_grpo              # run and compare with the references
    python -m tests.golden.tiny_grpo --update     # run and rewrite tiny_grpo.json
    python -m tests.golden.tiny_grpo --add NAME   # this machine's: tiny_grpo.NAME.json

Regenerating the reference is legitimate only when the numerics are meant to change: a
deliberate change to a loss, an estimator, the sampler, the model builder or this run, or a
torch/transformers upgrade or a new machine whose floating point differs. Say which in the
commit. Never regenerate to make a refactor pass: a refactor must reproduce it.

Bits differ between CPUs (their vector kernels sum in other orders), and a sampled token that
flips on one makes every later step differ, so a run matches the reference of the machine
kind it ran on: the test passes when it matches any checked-in reference (tiny_grpo.json and
tiny_grpo.<name>.json). Add one with --add only for a machine whose run of an unchanged
commit fails, and say so in the commit; --update after a deliberate change leaves the others
stale, so delete them (and re-add them from those machines).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import torch

from relayrl.config import RunConfig
from relayrl.contracts.messages import Batch, Group, Sample, decode_batch, encode_batch
from relayrl_tasks.rewards import get_reward, score
from relayrl_tasks.tasks import make_task
from relayrl_torch.models.loading import load_model
from relayrl_torch.models.tiny import build_model, build_tokenizer, warm_start
from rollout_svc.engines.api import SamplingSpec
from rollout_svc.engines.torch import TorchEngine
from trainer_svc.batching import collate, split_stale
from trainer_svc.learner import Learner

REFERENCE = Path(__file__).with_name("tiny_grpo.json")


def references() -> list[Path]:
    """tiny_grpo.json first, then every other machine kind's."""
    return [REFERENCE, *sorted(REFERENCE.parent.glob("tiny_grpo.*.json"))]


def closest_drift(got: list[dict[str, float]]) -> tuple[Path, list[str]]:
    """The reference `got` matches (no drift), else the one it drifts least from."""
    drifts = [(path, drift(got, json.loads(path.read_text())["steps"]))
              for path in references()]
    return min(drifts, key=lambda d: len(d[1]))
STEPS = 50
PROMPTS, SAMPLES = 4, 8  # prompts per step, samples per prompt
METRICS = ("loss", "reward_mean", "grad_norm", "entropy")
# Stated tolerance: 1e-4 relative, or 1e-6 absolute for figures near 0 (the loss of a
# batch whose advantages nearly cancel). A change that only reorders floating-point work
# stays well inside it; measured over the 50 steps, passing every row on its own
# (trainer.micro_batch_tokens=1, the same gradients summed in another order) moved the
# gradient norm by at most 3.4e-6 relative, the entropy by 8e-7, the loss by under 1e-7
# absolute, and no sampled token. A change to what is computed moves far more: a clip of
# 0.21 instead of 0.2 failed 170 of the 200 figures, the first at step 1.
RTOL, ATOL = 1e-4, 1e-6


def run(steps: int = STEPS, **trainer) -> list[dict[str, float]]:
    """Per-step loss, mean reward, gradient norm (before clipping) and mean token entropy;
    `trainer` overrides trainer settings (to measure what a change moves)."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        return _run(steps, trainer)
    finally:  # the settings are process-wide: a test run goes on after this one
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _run(steps: int, trainer: dict) -> list[dict[str, float]]:
    cfg = RunConfig.model_validate({
        "run_id": "golden", "task": {"digits": 1, "eval_size": 8, "seed": 7},
        "model": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "seed": 0,
                  "sft_steps": 200, "sft_eval_every": 1000, "sft_batch_size": 32,
                  "sft_lr": 1e-2},
        "rollout": {"max_new_tokens": 3},
        # two updates per batch: the second one's ratio moves off 1, so the clip and the
        # importance weights take part; a KL term exercises the reference policy
        "trainer": {"loss": {"name": "grpo", "kl_coef": 0.01}, "optimizer": {"lr": 1e-3},
                    "max_staleness": 0,
                    "engine_check_seqs": 0, "updates_per_batch": 2, "seed": 0, **trainer},
    })
    task = make_task(cfg.task)
    reward_fn = get_reward(task.reward_name)
    with tempfile.TemporaryDirectory() as tmp:
        build_tokenizer(task.alphabet, Path(tmp))
        build_model(cfg.model, cfg.model.limits().vocab_size,
                    Path(tmp)).save_pretrained(tmp)
        policy, sampler = load_model(tmp), load_model(tmp)
    torch.manual_seed(cfg.model.seed)
    warm_start(policy, task, cfg.model, task.max_answer_tokens, show_progress=False)
    torch.manual_seed(cfg.trainer.seed)
    learner = Learner(cfg.trainer_part(), policy)
    engine = TorchEngine(sampler, seed=0)  # every call passes its own seed
    out = []
    for step in range(steps):
        engine.load_weights({k: v.clone() for k, v in learner.weights().items()}, step)
        groups = []
        for i in range(PROMPTS):
            problem = task.problem(step * PROMPTS + i)
            prompt = sampler.encode_prompt(problem.text)
            completions = engine.generate(
                [prompt] * SAMPLES, SamplingSpec(cfg.rollout.max_new_tokens,
                                                 cfg.rollout.temperature, seed=step * 100 + i))
            samples = []
            for c in completions:
                reward, _ = score(reward_fn, sampler.decode(c.tokens), problem.reference)
                samples.append(Sample(
                    prompt_id=problem.prompt_id, lease_id="golden", worker_id="golden",
                    prompt_tokens=prompt, response_tokens=c.tokens, logprobs=c.logprobs,
                    versions=[step] * len(c.tokens), reward=reward,
                    finish_reason=c.finish_reason))
            groups.append(Group(problem.prompt_id, samples))
        batch = decode_batch(encode_batch(Batch(f"golden-{step}", groups)))  # the wire
        kept = split_stale(batch, step, cfg.trainer.max_staleness).kept
        assert len(kept) == PROMPTS, "staleness 0: every group is the current version's"
        tb = collate(kept, step, policy.pad_id, cfg.trainer.loss.scales_by_group_std)
        result = learner.update(tb)
        assert not result.nonfinite
        out.append({"loss": result.stats["loss"], "reward_mean": float(tb.rewards.mean()),
                    "grad_norm": result.stats["grad_norm"],
                    "entropy": result.stats["entropy"]})
    return out


def drift(got: list[dict[str, float]], want: list[dict[str, float]]) -> list[str]:
    """Every figure outside the tolerance, as 'step N metric: got X, reference Y'."""
    if len(got) != len(want):
        return [f"{len(got)} steps, reference {len(want)}"]
    bad = []
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        for key in METRICS:
            if not math.isclose(g[key], w[key], rel_tol=RTOL, abs_tol=ATOL):
                bad.append(f"step {i + 1} {key}: got {g[key]!r}, reference {w[key]!r}")
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="rewrite tiny_grpo.json")
    parser.add_argument("--add", metavar="NAME", help="write this machine kind's reference, "
                        "tiny_grpo.NAME.json")
    args = parser.parse_args(argv)
    got = run()
    if args.update or args.add:
        out = REFERENCE if args.update else REFERENCE.with_name(f"tiny_grpo.{args.add}.json")
        out.write_text(json.dumps({"steps": got}, indent=1) + "\n")
        print(f"wrote {out} ({len(got)} steps)")
        return 0
    path, bad = closest_drift(got)
    print("\n".join(bad) if bad else f"matches {path} ({len(got)} steps)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
