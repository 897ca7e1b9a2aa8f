"""One update, RelayRL's against TRL's: the same batches through RelayRL's trainer (collate,
then Learner.update: the shared-prompt pass, micro-batches, the GRPO loss, the clip, fused
AdamW) and through TRL's GRPOTrainer (its advantages, loss, clip and optimizer), step after
step from the same warm start; how far apart their gradients are at each step and their
weights at the end.

    python bench/peers_step.py                       # the tiny example, 5 steps
    python bench/peers_step.py --setup smollm2 --steps 2

bench/peers.py compares learning curves, where sampling noise hides a small difference in
the update. Here the samples are shared: each step's batch is drawn from RelayRL's current
policy by relayrl's sampler (the torch engine's) on the problems bench/peers.py hands both
sides, in its order, scored by the task's reward and passed through the wire codec as the
buffer hands it to the trainer; TRL's side (bench/peers_step_trl.py, in the benches' own
venv) takes the same rows. The ceiling is float rounding: a relative
difference near 1e-6 says the two updates are one. TRL divides by the group's std plus
1e-4 where RelayRL adds 1e-6, which alone moves a gradient by about 1e-5 of its size.
Prints a table and one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from bench.peers import SETUPS, bench_config, trl_spec  # noqa: E402
from bench.tools_venv import bench_python  # noqa: E402
from relayrl.config import RunConfig  # noqa: E402
from relayrl.contracts.messages import Batch, Group, Sample, decode_batch, encode_batch  # noqa: E402
from relayrl_tasks.rewards.scoring import score_group  # noqa: E402
from relayrl_tasks.rewards.spec import get_reward  # noqa: E402
from relayrl_tasks.tasks import make_task  # noqa: E402
from relayrl_torch.models.cache import resolve_model_path  # noqa: E402
from relayrl_torch.models.loading import LoadedModel, load_model  # noqa: E402
from relayrl_torch.sampling.sampler import sample  # noqa: E402
from trainer_svc.batching import collate  # noqa: E402
from trainer_svc.learner import Learner  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def batch(cfg: RunConfig, lm: LoadedModel, step: int, generator: torch.Generator
          ) -> list[Group]:
    """Step `step`'s groups: its problems (ids in the order the scheduler hands them out)
    sampled from the current policy, scored by the task's reward."""
    task = make_task(cfg.task)
    reward = get_reward(task.reward_name)
    per_step, n = cfg.buffer.groups_per_batch, cfg.buffer.group_size
    lm.model.eval()
    groups = []
    for pid in range(step * per_step, (step + 1) * per_step):
        problem = task.problem(pid)
        prompt = lm.encode_problem(problem.text, problem.messages)
        outs = sample(lm.model, [prompt] * n, max_new_tokens=cfg.rollout.max_new_tokens,
                      eos_ids=lm.eos_ids, pad_id=lm.pad_id, temperature=cfg.rollout.temperature,
                      generator=generator)
        scores = score_group(reward, [lm.decode(o.tokens) for o in outs], problem.reference)
        groups.append(Group(pid, [Sample(
            prompt_id=pid, lease_id="bench", worker_id="bench", prompt_tokens=np.array(prompt),
            response_tokens=np.array(o.tokens), logprobs=np.array(o.logprobs, np.float32),
            versions=np.full(len(o.tokens), step), reward=r, finish_reason=o.finish_reason)
            for o, (r, _) in zip(outs, scores, strict=True)]))
    return groups


def relayrl_steps(cfg: RunConfig, steps: int) -> dict:
    """RelayRL's side: per step the rows, the clipped gradient and its norm; the weights at
    the start and the end."""
    lm = load_model(resolve_model_path(cfg.model, cfg.task))
    learner = Learner(cfg.trainer_part(), lm)
    start = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    generator = torch.Generator().manual_seed(cfg.rollout.seed)
    out = []
    for step in range(steps):
        # through the wire codec, as the buffer hands a batch to the trainer
        groups = decode_batch(encode_batch(Batch(f"step-{step}",
                                                 batch(cfg, lm, step, generator)))).groups
        tb = collate(groups, step, lm.pad_id, cfg.trainer.loss.scales_by_group_std)
        result = learner.update(tb)
        out.append({
            "rows": [(s.prompt_tokens.tolist(), s.response_tokens.tolist(), s.reward)
                     for g in groups for s in g.samples],
            "grads": {n: p.grad.detach().clone() for n, p in lm.model.named_parameters()},
            "grad_norm": result.stats["grad_norm"]})
        print(f"step {step + 1}: reward {tb.rewards.mean().item():.3f}, "
              f"gradient norm {result.stats['grad_norm']:.4f}", flush=True)
    end = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    return {"steps": out, "start": start, "end": end, "pad_id": lm.pad_id}


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("peers_step", __doc__.splitlines()[0])
    parser.add_argument("--setup", choices=sorted(SETUPS), default="tiny")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of RelayRL's config, as bench/peers.py takes it")
    parser.add_argument("--out", type=Path, default=Path("/tmp/relayrl-peers-step"))
    args = parser.parse_args(argv)
    if args.smoke:
        harness.skip(args, "TRL's side runs in its own venv (bench/.venv), made on first use")
    if args.steps < 1:
        raise ValueError(f"--steps: {args.steps}; at least 1")
    config = SETUPS[args.setup][0]
    cfg = bench_config(config, steps=args.steps, every=args.steps, run_dir=args.out / "run",
                       overrides=args.set)
    spec = json.loads(trl_spec(cfg, args.steps, args.steps, args.out, 0).read_text())
    if spec["bf16"]:
        raise ValueError("--set trainer.precision=bf16: this bench compares float32 updates")
    ours = relayrl_steps(cfg, args.steps)
    data, report = args.out / "relayrl_steps.pt", args.out / "trl_steps.json"
    torch.save({"spec": spec, **ours}, data)
    subprocess.run([str(bench_python()), str(ROOT / "bench" / "peers_step_trl.py"),
                    "--input", str(data), "--out", str(report)], check=True, cwd=ROOT)
    data.unlink()  # gradients of every step: a SmolLM2 step's are 0.5 GB
    theirs = json.loads(report.read_text())
    print("\nstep  gradient norm RelayRL / TRL  relative gradient difference  cosine")
    for i, row in enumerate(theirs["steps"]):
        print(f"{i + 1:>4}  {ours['steps'][i]['grad_norm']:>12.5f} / {row['grad_norm']:<9.5f}"
              f"  {row['relative_difference']:>28.2e}  {row['cosine']:.8f}")
    print(f"weights after {args.steps} steps: the updates differ by "
          f"{theirs['update_relative_difference']:.2e} of TRL's")
    harness.report(args, {"bench": "peers_step", "setup": args.setup, "steps": args.steps,
                          "max_relative_gradient_difference": max(
                              r["relative_difference"] for r in theirs["steps"]),
                          "update_relative_difference": theirs["update_relative_difference"],
                          "trl_version": theirs["trl_version"]})


if __name__ == "__main__":
    main()
