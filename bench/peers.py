"""RelayRL against the peer a user would pick instead on one machine, TRL's GRPOTrainer in one
process: held-out accuracy against wall time, the time each takes to given accuracy levels,
and their ratio.

    python bench/peers.py                                    # the tiny example, 3 rounds a side
    python bench/peers.py --setup smollm2 --rounds 3         # SmolLM2-135M-Instruct, chat sums
    python bench/peers.py --rounds 1 --steps 200 --out /tmp  # a quick look, drawn in /tmp

Both sides get the config's task, model and warm start (its cached model), batch (prompts x
samples a step), learning rate, gradient clip and loss (GRPO: group-scaled advantages, a
token mean per sequence, the ratio clipped at 0.2, no KL term), the same problems in the same
order (TRL's dataset is not shuffled, so step k learns from the same problems on both sides
and the per-step accuracies compare like with like) and the same number of steps. TRL runs
in the benches' own venv (bench/tools_venv.py: pinned, made on first use with the project's
own torch, transformers and math-verify), never a project dependency.

Both compute in float32, or with --bf16 both in bfloat16: RelayRL's trainer under autocast
with float32 master weights, and its vLLM engine's weights; TRL with bf16=True (accelerate's
autocast). Rounds alternate (RelayRL, TRL, RelayRL, ...), each side with the machine to
itself. Round r seeds both sides with the config's seeds plus r (RelayRL's trainer and
sampler, TRL's run), so the rounds are independent draws, not replays of one trajectory.
Each side saves the policy every --every steps with its wall time since its command started
(service start-up and model loading included). Afterwards every saved policy is evaluated
offline by relayrl's evaluator on the config's held-out set with its seed, so evaluation
costs neither side training time, and then deleted. A setup may sample each held-out
problem several times (pass@1 is their mean): one answer per problem of a 25-problem set
reads pass@1 with a spread of about 0.1. Reported (bench/peers_report.py has the
arithmetic): the median and the spread over rounds of each side's time to each level, the
ratio TRL time / RelayRL time (above 1: RelayRL is faster), samples/s, each side's pass@1
per saved step;
a plot (<out>/peers_<setup>.png, --out docs/results by default, shown on the results page),
the report and the rounds' curves under runs/bench_peers/<setup>/ (peers_<setup>.md,
peers_<setup>_rounds.json) and a JSON line.

With --extra-steps N both sides train N steps past --steps and the levels come from TRL's
saves up to --steps: TRL's final level is the median of its rounds' finals, which about half
of any side's rounds reach only after that step, so without the extra steps such a round
counts as a miss and a median time to the level often does not exist on either side.

More rounds later: `--first-round 3 --merge
runs/bench_peers/smollm2/peers_smollm2_rounds.json` runs rounds 3, 4, ... and reports them
together with the earlier command's (same setup, steps and settings).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from bench.common import ROOT, assign_free_ports, evaluate_checkpoint, run_stack  # noqa: E402
from bench.peers_report import Run, markdown, plot, summarize  # noqa: E402
from bench.tools_venv import TRL_VERSION, bench_python  # noqa: E402
from relayrl.config import RunConfig, load_run_config  # noqa: E402

SETUPS = {  # config, steps, steps between saved policies, answers per held-out problem
    "tiny": ("examples/tiny_cpu.yaml", 1200, 50, 1),
    "smollm2": ("examples/smollm2_cpu.yaml", 30, 5, 4),
}
# what both sides run alike: RelayRL's config may not change these with --set
SHARED = ("task.", "model.", "buffer.", "eval.", "trainer.optimizer.lr", "trainer.loss",
          "trainer.optimizer.grad_clip",
          "trainer.max_steps", "trainer.seed", "trainer.precision", "rollout.max_new_tokens",
          "rollout.temperature", "rollout.seed",
          "rollout.engine.dtype")
BF16 = ["trainer.precision=bf16", "rollout.engine.dtype=bfloat16"]  # --bf16, RelayRL's side
SEED_STRIDE = 1000  # rollout.seed is offset by worker index: keep rounds' workers apart


def bench_config(path: str, steps: int, every: int, run_dir: Path, round_: int = 0,
                 eval_samples: int = 1, overrides: list[str] | None = None) -> RunConfig:
    """A fresh run in `run_dir`: what an earlier bench left there goes, or the trainer would
    resume from its checkpoints and the round would measure nothing."""
    shutil.rmtree(run_dir, ignore_errors=True)
    data = load_run_config(path, overrides or []).model_dump(mode="json")
    data["run_dir"] = str(run_dir)
    data["trainer"].update(max_steps=steps, checkpoint={"every": every, "keep": 1000},
                           progress=False, seed=data["trainer"]["seed"] + round_)
    data["rollout"]["seed"] += SEED_STRIDE * round_
    data["eval"]["every"] = 0  # evaluated offline afterwards, as TRL's side is
    for s in data["eval"]["sets"]:
        s["samples"] = eval_samples
    assign_free_ports(data)
    return RunConfig.model_validate(data)


def run_relayrl(cfg: RunConfig) -> list[tuple[int, float, Path]]:
    """The whole stack until max_steps: (step, seconds since start, checkpoint) per save."""
    start = time.time()
    run_stack(cfg)
    saves = sorted((Path(cfg.run_dir) / "checkpoints").glob("step_*"))
    return [(int(p.name.split("_")[1]), (p / "trainer_state.json").stat().st_mtime - start, p)
            for p in saves]


def trl_spec(cfg: RunConfig, steps: int, every: int, work: Path, round_: int) -> Path:
    """The problems RelayRL's scheduler hands out (ids 0..), as TRL's dataset, and the run's
    settings, for bench/peers_trl.py."""
    from transformers import AutoTokenizer

    from relayrl_tasks.tasks import make_task
    from relayrl_torch.models.cache import resolve_model_path

    model = resolve_model_path(cfg.model, cfg.task)
    bos = AutoTokenizer.from_pretrained(model).bos_token or ""  # relayrl prefixes raw text
    task = make_task(cfg.task)
    per_step = cfg.buffer.groups_per_batch
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "train.jsonl", "w") as f:
        for i in range(steps * per_step):
            p = task.problem(i)
            prompt = [dict(m) for m in p.messages] if p.messages else bos + p.text
            f.write(json.dumps({"prompt": prompt, "answer": p.reference}) + "\n")
    loss = cfg.trainer.loss
    if loss.name != "grpo" or loss.kl_coef or not loss.scales_by_group_std:
        raise ValueError(f"{cfg.run_id}: the peer runs GRPO with group-scaled advantages and "
                         f"no KL; the config's loss is {loss}")
    spec = {"model": str(model), "train": str(work / "train.jsonl"),
            "reward": task.reward_name, "steps": steps, "prompts_per_step": per_step,
            "samples_per_prompt": cfg.buffer.group_size,
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "temperature": cfg.rollout.temperature, "lr": cfg.trainer.optimizer.lr,
            "grad_clip": cfg.trainer.optimizer.grad_clip, "clip_eps": loss.clip_eps, "every": every,
            "seed": cfg.trainer.seed,  # the round's: bench_config offsets it
            "bf16": cfg.trainer.precision == "bf16"}
    path = work / f"spec_{round_}.json"
    path.write_text(json.dumps(spec, indent=1))
    return path


def run_trl(python: Path, spec: Path, out: Path) -> list[tuple[int, float, Path]]:
    shutil.rmtree(out, ignore_errors=True)  # saves.jsonl is appended to
    start = time.time()
    with open(out.parent / f"{out.name}.log", "w") as log:
        subprocess.run([str(python), str(ROOT / "bench" / "peers_trl.py"), "--spec",
                        str(spec), "--out", str(out)], check=True, stdout=log,
                       stderr=subprocess.STDOUT, cwd=ROOT)
    rows = [json.loads(line) for line in (out / "saves.jsonl").read_text().splitlines()]
    return [(r["step"], r["time"] - start, Path(r["path"])) for r in rows]


def evaluated(cfg: RunConfig, side: str, saves: list[tuple[int, float, Path]],
              start: float, key: str) -> Run:
    curve, steps = [(0.0, start)], [0]
    for step, seconds, path in saves:
        curve.append((seconds, evaluate_checkpoint(cfg, path)[key]))
        steps.append(step)
        shutil.rmtree(path)  # a SmolLM2 round's saves take 7.6 GB: nine filled the disk
        print(f"  {side} step {step:>5} at {seconds:7.1f} s: {key} {curve[-1][1]:.3f}",
              flush=True)
    batch = cfg.buffer.groups_per_batch * cfg.buffer.group_size
    return Run(side=side, curve=curve, steps=steps, samples=saves[-1][0] * batch,
               seconds=saves[-1][1])


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("peers", __doc__.splitlines()[0], rounds=3,
                            rounds_help="rounds of both sides, each a seed of its own")
    parser.add_argument("--setup", choices=sorted(SETUPS), default="tiny")
    parser.add_argument("--steps", type=int, help="default: the setup's")
    parser.add_argument("--every", type=int, help="steps between saved policies")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results"))
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.FIELD=VALUE",
                        help="change RelayRL's config (e.g. scheduler.max_inflight_prompts=6); "
                        "what TRL's side shares with it (task, batch, loss) is refused")
    parser.add_argument("--first-round", type=int, default=0,
                        help="seed offset of the first round (rounds already run elsewhere)")
    parser.add_argument("--merge", action="append", default=[], metavar="ROUNDS_JSON",
                        help="report these rounds too: an earlier command's "
                        "peers_<setup>_rounds.json with the same setup, steps and settings")
    parser.add_argument("--extra-steps", type=int, default=0,
                        help="both sides train this many steps past --steps, and the levels "
                        "come from TRL's accuracy at --steps: a round that gets there after "
                        "TRL's nominal end is timed instead of counted as a miss")
    parser.add_argument("--bf16", action="store_true",
                        help="both sides compute in bfloat16: RelayRL's trainer passes under "
                        "autocast and its vLLM engine's weights, TRL's run (bf16=True)")
    args = parser.parse_args(argv)
    if args.smoke:
        harness.skip(args, "TRL's side runs in its own venv (bench/.venv), made on first use")
    path, steps, every, eval_samples = SETUPS[args.setup]
    steps, every = args.steps or steps, args.every or every
    if args.rounds < 1 or steps < every or every < 1 or args.extra_steps < 0:
        parser.error("need --rounds >= 1, --steps >= --every >= 1 and --extra-steps >= 0")
    shared = [o for o in args.overrides if o.split("=", 1)[0].startswith(SHARED)]
    if shared:
        parser.error(f"--set {shared[0]}: both sides share that setting; change the config")
    if args.bf16:
        args.overrides += BF16
    settings = {"setup": args.setup, "steps": steps, "every": every,
                "overrides": sorted(args.overrides)}
    if args.extra_steps:  # absent otherwise, so earlier rounds files still merge
        settings["extra_steps"] = args.extra_steps
    total = steps + args.extra_steps
    try:
        merged = [rec for path in args.merge for rec in earlier_rounds(Path(path), settings)]
    except ValueError as err:
        parser.error(str(err))
    rounds = range(args.first_round, args.first_round + args.rounds)
    clash = sorted({rec["round"] for rec in merged} & set(rounds))
    if clash:
        parser.error(f"--first-round {args.first_round}: rounds {clash} are in --merge already")
    python = bench_python()
    work = ROOT / "runs" / "bench_peers" / args.setup
    first = bench_config(path, steps, every, work / "relayrl_0", 0, eval_samples,
                         args.overrides)
    key = f"eval/{first.eval.sets[0].name}/pass@1"
    from relayrl_torch.models.cache import resolve_model_path

    start = evaluate_checkpoint(first, resolve_model_path(first.model, first.task))[key]
    print(f"{args.setup}: the warm start's {key} is {start:.3f}", flush=True)
    records = list(merged)
    for r in rounds:
        cfg = bench_config(path, total, every, work / f"relayrl_{r}", r, eval_samples,
                           args.overrides)
        spec = trl_spec(cfg, total, every, work, r)
        print(f"round {r + 1}/{rounds.stop}: RelayRL, {total} steps", flush=True)
        records.append({"round": r, **asdict(evaluated(cfg, "relayrl", run_relayrl(cfg),
                                                        start, key))})
        print(f"round {r + 1}/{rounds.stop}: TRL {TRL_VERSION}, {total} steps", flush=True)
        saves = run_trl(python, spec, work / f"trl_{r}")
        records.append({"round": r, **asdict(evaluated(cfg, "trl", saves, start, key))})
    runs = [Run(**{k: v for k, v in rec.items() if k != "round"}) for rec in records]
    report = summarize(runs, start, steps if args.extra_steps else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"peers_{args.setup}.png"
    (work / f"peers_{args.setup}_rounds.json").write_text(json.dumps(
        {**settings, "start": start, "runs": records}) + "\n")
    plot(runs, report, png)
    (work / f"peers_{args.setup}.md").write_text(markdown(
        report, args.setup, path, TRL_VERSION, args.command,
        os.path.relpath(png.resolve(), work.resolve())))
    harness.report(args, {"bench": "peers", "setup": args.setup, "trl": TRL_VERSION,
                          "rounds": len(records) // 2, "steps": steps, **report},
                   picture=png)


def earlier_rounds(path: Path, settings: dict) -> list[dict]:
    """The round records of an earlier command's rounds JSON, refused unless it ran these
    settings (setup, steps, saves and --set)."""
    data = json.loads(path.read_text())
    ran = {k: data.get(k) for k in settings}
    if ran != settings:
        raise ValueError(f"--merge {path}: its rounds ran {ran}, this command {settings}")
    return data["runs"]


if __name__ == "__main__":
    main()
