"""A rollout worker's batch as single-turn samples against the same batch as 3-turn episodes,
in one process on the tiny model (no services): where a multi-turn step's time goes.

    python bench/multiturn.py                       # figures
    python bench/multiturn.py --profile 25          # and the 25 costliest calls of each

Both runs generate the same number of policy tokens per sequence: single-turn samples with
`ignore_eos` write exactly --tokens tokens; each episode's turns write --tokens/3 tokens
each (the environment stops every reply there by answering a fixed-length turn), and its
environment answers with a short observation between them. Reported per run: seconds per
batch (best of --rounds, the runs alternating), the engine's share, and policy tokens per
second; then the multi-turn/single-turn time ratio. Torch runs on one thread (--threads) so
that a shared machine's other work disturbs less; still, repeat.
"""

from __future__ import annotations

import cProfile
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from pstats import Stats as ProfileStats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench import harness  # noqa: E402
from relayrl.config import RunConfig, TinyModel  # noqa: E402
from relayrl.contracts.leases import LeasedPrompt  # noqa: E402
from relayrl.plugins.envs import Environment, Step  # noqa: E402
from relayrl_tasks.tasks import AdditionTask  # noqa: E402
from relayrl_torch.models.loading import LoadedModel, load_model  # noqa: E402
from relayrl_torch.models.tiny import SPECIALS, build_model, build_tokenizer  # noqa: E402
from rollout_svc.engines.torch import TorchEngine  # noqa: E402
from rollout_svc.episode_generator import EpisodeGenerator  # noqa: E402
from rollout_svc.group_generator import GroupGenerator  # noqa: E402

# a template that only appends (as chat templates do), so the glue is the template's
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}+"
            "{{ m['content'] }}{{ eos_token }}{% else %}{{ m['content'] }}={% endif %}"
            "{% endfor %}{% if add_generation_prompt %}+{% endif %}")
TURNS = 3


class ThreeTurns(Environment):
    """Answers the first two replies with the next operand; done on the third."""

    def __init__(self):
        self.steps = 0

    def step(self, message):
        self.steps += 1
        if self.steps == TURNS:
            return Step([], 1.0, True)
        return Step([{"role": "user", "content": "12+34"}])


class OffRedis:
    """The generators' Redis calls (live settings, token counts) answered as a fresh run's."""

    def pipeline(self, transaction=False):
        return self

    def hgetall(self, key):
        return self

    def get(self, key):
        return self

    def execute(self):
        return [{}, None]

    def hincrby(self, *args):
        return 0


class FixedTurns(TorchEngine):
    """Replies of exactly `turn_tokens` tokens, each ending as if the model stopped: the same
    policy tokens per episode whatever the random model samples."""

    turn_tokens = 0

    def generate(self, prompts, spec):
        outs = super().generate(prompts, dataclasses.replace(
            spec, max_new_tokens=min(spec.max_new_tokens, self.turn_tokens or spec.max_new_tokens),
            ignore_eos=True))
        for o in outs if self.turn_tokens else ():
            o.finish_reason = "stop"
        return outs


def tiny(out: Path) -> LoadedModel:
    from transformers import AutoTokenizer

    build_tokenizer(AdditionTask.alphabet, out)
    cfg = TinyModel(hidden_size=128, num_layers=4, num_heads=4)  # examples/tiny_cpu.yaml's
    build_model(cfg, len(SPECIALS) + len(set(AdditionTask.alphabet)), out).save_pretrained(out)
    lm = load_model(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = TEMPLATE
    return LoadedModel(lm.model, tokenizer, lm.path)


def batch(lm, args, multi: bool) -> tuple[float, float, int]:
    rollout = {"max_new_tokens": args.tokens,
               "segment_tokens": 0}
    if multi:
        rollout["environment"] = {"cls": "bench.multiturn:ThreeTurns", "max_turns": TURNS}
    cfg = RunConfig.model_validate({"buffer": {"group_size": args.samples},
                                    "rollout": rollout})
    engine = FixedTurns(lm, seed=3, kv_cache_tokens=cfg.rollout.engine.kv_cache_tokens)
    engine.turn_tokens = args.tokens // TURNS if multi else 0
    writer = type("Writer", (), {"r": OffRedis()})()
    gen = (EpisodeGenerator if multi else GroupGenerator)(cfg.rollout_part(), engine, lm, writer)
    leases = [LeasedPrompt(f"l{i}", i, "", "3", 0,
                           messages=({"role": "user", "content": f"{10 + i}+{20 + i}"},))
              for i in range(args.groups)]
    start = time.perf_counter()
    busy0 = engine.stats().get("busy_s", 0.0)
    groups = [gen.start(lease) for lease in leases]
    while not all(g.finished for g in groups):
        gen.generate_segment([g for g in groups if not g.finished])
    wall = time.perf_counter() - start
    busy = engine.stats().get("busy_s", 0.0) - busy0
    policy = sum(e.policy_tokens for g in groups for e in g.episodes) if multi else sum(
        len(s.tokens) for g in groups for s in g.sequences)
    return wall, busy, policy


def main(argv: list[str] | None = None) -> None:
    p = harness.parser("multiturn", __doc__.split("\n\n")[0], rounds=5,
                       rounds_help="alternating runs of each kind; each reports its best",
                       rounds_aliases=("--repeats",),
                       smoke_help="the smallest run of the same path (2 groups of 2, one "
                       "round): checks that the bench runs, measures nothing")
    p.add_argument("--groups", type=int, default=8, help="groups per batch")
    p.add_argument("--samples", type=int, default=8, help="samples per group")
    p.add_argument("--tokens", type=int, default=24, help="policy tokens per sample")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--profile", type=int, default=0, help="print the N costliest calls")
    args = p.parse_args(argv)
    if args.smoke:
        args.groups, args.samples, args.tokens, args.rounds = 2, 2, 6, 1
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        lm = tiny(Path(tmp))
        kinds = (("single", False), ("multi", True))
        runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name, _ in kinds}
        profiles = {name: cProfile.Profile() for name, _ in kinds}
        for _, multi in kinds:
            batch(lm, args, multi)  # warm-up
        for _ in range(args.rounds):  # alternating, so that a busy spell hits both
            for name, multi in kinds:
                if args.profile:
                    profiles[name].enable()
                runs[name].append(batch(lm, args, multi))
                if args.profile:
                    profiles[name].disable()
        figures = {}
        for name, _ in kinds:
            wall = min(r[0] for r in runs[name])
            busy = min(r[1] for r in runs[name])
            tokens = runs[name][0][2]
            figures[name] = {"batch_s": round(wall, 4), "engine_s": round(busy, 4),
                             "outside_engine_s": round(wall - busy, 4),
                             "policy_tokens": tokens, "tokens_per_s": round(tokens / wall, 1)}
            print(f"{name:>6}: {wall:.4f} s a batch ({busy:.4f} s in the engine), {tokens} "
                  f"policy tokens, {tokens / wall:.0f} tokens/s (best of {args.rounds})")
            if args.profile:
                ProfileStats(profiles[name]).sort_stats("tottime").print_stats(args.profile)
        ratio = figures["multi"]["batch_s"] / figures["single"]["batch_s"]
        print(f"multi-turn / single-turn: {ratio:.2f}x")
        harness.report(args, {**figures, "ratio": round(ratio, 2)})


if __name__ == "__main__":
    main()
